"""An utterance's chunks at another speed: audio stretched, word times scaled with it.

The engine wraps an utterance's chunks (at the codec's rate, before any resampling a front door
does) in ``at_speed`` when the caller asks for a speed other than 1.0; at 1.0 it does not wrap
them at all, so the chunks are the very ones the engine made.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import replace

import numpy as np

from pipecat_veena.interface import AudioChunk, WordTiming
from pipecat_veena.streaming.tsm import TimeStretcher


async def at_speed(
    chunks: AsyncIterator[AudioChunk],
    stretcher: TimeStretcher,
    changes: Callable[[], list[tuple[int, float]]] | None = None,
    pauses: Mapping[int, int] | None = None,
) -> AsyncIterator[AudioChunk]:
    """``chunks`` played through ``stretcher`` (one utterance).

    Each chunk's audio is stretched (the stage holds back at most one window, released by the
    last chunk); word times are mapped with ``stretcher.output_time``, and a word rides the first
    chunk by whose end its stretched audio is out (so, as without a speed, a word arrives with or
    after its audio). A chunk left with neither audio nor words is not yielded.

    With ``changes`` (speed changes at samples of the input, noted before that input comes:
    SSML ``<prosody rate>`` spans), each is scheduled on the stretcher (``set_speed_at``) before
    the next chunk is fed. ``pauses`` (first input sample: samples; SSML breaks, each a chunk of
    its own) pass around the stretcher: it is flushed before one and starts afresh after it, so
    a break keeps its exact length at any speed.
    """
    rate = stretcher.sample_rate
    pending: list[WordTiming] = []
    emitted = 0  # output samples yielded
    fed = 0  # input samples of the utterance seen
    in_at, out_at = 0, 0.0  # where the stretcher's stream started: input sample, output seconds
    last: AudioChunk | None = None

    def ready(until: float) -> tuple[WordTiming, ...]:
        done = [w for w in pending if w.end <= until]
        del pending[: len(done)]
        return tuple(done)

    def mapped(t: float) -> float:
        return round(out_at + stretcher.output_time(t - in_at / rate), 4)

    async with aclosing(chunks) as source:
        async for chunk in source:
            last = chunk
            n = chunk.num_samples
            if pauses and n and pauses.get(fed) == n:  # exact silence, not stretched
                pending.extend(_mapped(chunk.words, mapped))  # (all before the pause)
                samples = np.concatenate([stretcher.flush(), np.frombuffer(chunk.pcm, dtype="<i2")])
                fed += n
                emitted += len(samples)
                in_at, out_at = fed, emitted / rate
            else:
                for at, speed in changes() if changes is not None else ():
                    stretcher.set_speed_at(max(at - in_at, 0), speed)
                fed += n
                samples = stretcher.process(np.frombuffer(chunk.pcm, dtype="<i2"))
                emitted += len(samples)
                pending.extend(_mapped(chunk.words, mapped))
            words = ready(emitted / rate + 1e-6)
            if len(samples) or words:
                yield replace(chunk, pcm=samples.astype("<i2").tobytes(), words=words)
    if last is not None:
        tail = stretcher.flush()
        if len(tail) or pending:
            yield replace(last, pcm=tail.astype("<i2").tobytes(), words=ready(float("inf")))


def _mapped(words: tuple[WordTiming, ...], at: Callable[[float], float]) -> list[WordTiming]:
    return [replace(w, start=at(w.start), end=at(w.end)) for w in words]
