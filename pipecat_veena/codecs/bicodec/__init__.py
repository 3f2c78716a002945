"""BiCodec (Spark-TTS / Veena3 audio codec) decoder: semantic + global ids -> 16 kHz audio."""

from pipecat_veena.codecs.bicodec.checkpoint import write_random_checkpoint
from pipecat_veena.codecs.bicodec.codec import BiCodecCodec
from pipecat_veena.codecs.bicodec.config import BiCodecConfig
from pipecat_veena.codecs.bicodec.model import BiCodecDecoder

__all__ = ["BiCodecCodec", "BiCodecConfig", "BiCodecDecoder", "write_random_checkpoint"]
