"""Audio codecs: token windows in, waveform out."""

from pipecat_veena.codecs.base import AudioCodec, CodecWindow

__all__ = ["AudioCodec", "CodecWindow"]
