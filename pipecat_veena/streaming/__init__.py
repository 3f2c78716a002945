"""The sliding-window decoder: codec tokens in, seamless audio out, batched across streams.

``schedule`` owns the window numbers (``StreamConfig``, the measured defaults per codec) and the
pure scheduler; ``decoder`` runs it on codes (``StreamDecoder``, the stitcher); ``batching``
decodes the windows of every stream in one codec call (``DecodeBatcher``).
"""

from pipecat_veena.streaming.decoder import DecodeJob, StreamDecoder
from pipecat_veena.streaming.schedule import StreamConfig, StreamScheduler, Window, should_hurry

__all__ = [
    "DecodeJob",
    "StreamConfig",
    "StreamDecoder",
    "StreamScheduler",
    "Window",
    "should_hurry",
]
