"""Token generation backends: prompt token ids in, new token ids out, abortable."""

from pipecat_veena.generation.base import SamplingOptions, TokenDelta, TokenGenerator
from pipecat_veena.generation.lora import LoraAdapter

__all__ = ["LoraAdapter", "SamplingOptions", "TokenDelta", "TokenGenerator"]
