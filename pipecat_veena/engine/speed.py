"""An utterance's chunks at another speed: audio stretched, word times scaled with it.

The engine wraps an utterance's chunks (at the codec's rate, before any resampling a front door
does) in ``at_speed`` when the caller asks for a speed other than 1.0; at 1.0 it does not wrap
them at all, so the chunks are the very ones the engine made.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import replace

import numpy as np

from pipecat_veena.interface import AudioChunk, WordTiming
from pipecat_veena.streaming.tsm import TimeStretcher


async def at_speed(
    chunks: AsyncIterator[AudioChunk],
    stretcher: TimeStretcher,
    changes: Callable[[], list[tuple[int, float]]] | None = None,
) -> AsyncIterator[AudioChunk]:
    """``chunks`` played through ``stretcher`` (one utterance).

    With ``changes`` (speed changes at samples of the input, noted before that input comes:
    SSML ``<prosody rate>`` spans and breaks), each is scheduled on the stretcher
    (``set_speed_at``) before the next chunk is fed.

    Each chunk's audio is stretched (the stage holds back at most one window, released by the
    last chunk); word times are mapped with ``stretcher.output_time``, and a word rides the first
    chunk by whose end its stretched audio is out (so, as without a speed, a word arrives with or
    after its audio). A chunk left with neither audio nor words is not yielded.
    """
    rate = stretcher.sample_rate
    pending: list[WordTiming] = []
    emitted = 0  # output samples yielded
    last: AudioChunk | None = None

    def ready(until: float) -> tuple[WordTiming, ...]:
        done = [w for w in pending if w.end <= until]
        del pending[: len(done)]
        return tuple(done)

    async with aclosing(chunks) as source:
        async for chunk in source:
            last = chunk
            for at, speed in changes() if changes is not None else ():
                stretcher.set_speed_at(at, speed)
            samples = stretcher.process(np.frombuffer(chunk.pcm, dtype="<i2"))
            emitted += len(samples)
            pending.extend(
                replace(
                    w,
                    start=round(stretcher.output_time(w.start), 4),
                    end=round(stretcher.output_time(w.end), 4),
                )
                for w in chunk.words
            )
            words = ready(emitted / rate + 1e-6)
            if len(samples) or words:
                yield replace(chunk, pcm=samples.astype("<i2").tobytes(), words=words)
    if last is not None:
        tail = stretcher.flush()
        if len(tail) or pending:
            yield replace(last, pcm=tail.astype("<i2").tobytes(), words=ready(float("inf")))
