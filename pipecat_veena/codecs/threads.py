"""Torch intra-op threads for one codec call: the small calls of a stream's start on one core.

On a CPU the codec shares the cores with the LLM (vLLM's CPU engine runs its own OpenMP
threads in its own process: cores - 1 of them, unpinned, ``generation.vllm_local``). A stream's
first windows are small (BiCodec's default schedule emits 4, then 8 frames) and its convolutions
run far below peak on two cores: per window, two threads cost 1.3-1.6x the CPU of one for a
1.2-1.4x shorter decode, CPU the LLM needs at that moment for the next tokens. Measured end to
end (``benchmarks.threads``, spark demo, 2 cores) with vLLM's engine pinned to one core, calls
of at most 8 frames on one thread lowered the time to first audio (one call 323 -> 275 ms) and
the real-time factor (0.73 -> 0.68, four calls 1.71 -> 1.44); with the engine unpinned (the
default since) the difference is within the noise, and the codec CPU saved on short streams
remains (``benchmarks.codec_cpu --streamed``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def intra_op_threads(limit: int | None) -> Iterator[None]:
    """Run the block with at most ``limit`` torch intra-op threads (None: as set).

    Torch keeps the count per calling thread (OpenMP's) and as the default of new threads; both
    are restored on exit. Call it from the thread that runs the codec (the decode worker).
    """
    before = torch.get_num_threads()
    if limit is None or limit >= before:
        yield
        return
    torch.set_num_threads(limit)
    try:
        yield
    finally:
        torch.set_num_threads(before)
