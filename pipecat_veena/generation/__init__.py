"""Token generation backends: prompt token ids in, new token ids out, abortable."""

from pipecat_veena.generation.base import SamplingOptions, TokenDelta, TokenGenerator

__all__ = ["SamplingOptions", "TokenDelta", "TokenGenerator"]
