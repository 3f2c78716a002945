"""DecodeBatcher: batched results equal unbatched ones under concurrent asyncio streams.

Also: bounded batches on one worker thread (never the event loop), a cancelled waiter or a bad
window breaks no other stream, close() leaves no thread or task behind.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from test_streaming import FakeCodec

from pipecat_veena.codecs.base import CodecWindow
from pipecat_veena.streaming import StreamConfig, StreamDecoder
from pipecat_veena.streaming.batching import DecodeBatcher, group_by_length


class RecordingCodec(FakeCodec):
    """The fake codec of test_streaming, also recording the thread of each call and able to block.

    ``gate`` (a threading.Event, set by default) holds every decode until the test releases it;
    ``entered`` is set when a decode has started (``await codec.started()`` waits for it).
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def decode_windows(self, windows: Sequence[CodecWindow]) -> list[np.ndarray]:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        self.gate.wait(timeout=10)
        return super().decode_windows(windows)

    async def started(self) -> None:
        """Wait until the worker thread is inside a decode."""
        assert await asyncio.to_thread(self.entered.wait, 10), "no decode started"


def _bursts(seed: int, total: int) -> list[int]:
    """Push sizes summing to ``total`` (the same for a stream's batched and solo runs)."""
    rng, sizes = random.Random(seed), []
    while sum(sizes) < total:
        sizes.append(min(total - sum(sizes), rng.choice([1, 1, 2, 5])))
    return sizes


async def _stream_through(
    batcher: DecodeBatcher, codec, codes: list[int], seed: int, config, condition=None
):
    """One stream: push codes in bursts, decoding each planned window via the batcher."""
    decoder, chunks, i = StreamDecoder(codec, config, condition=condition), [], 0
    for n in _bursts(seed, len(codes)):
        jobs = decoder.plan(codes[i : i + n])
        i += n
        for job in jobs:
            chunks.append(decoder.accept(job, await batcher.decode(job.window)))
        await asyncio.sleep(0)
    for job in decoder.plan_finish():
        chunks.append(decoder.accept(job, await batcher.decode(job.window)))
    return chunks


def _solo(codec, codes: list[int], seed: int, config, condition=None) -> list[np.ndarray]:
    """The same stream decoded alone, with the same push sizes (hence the same windows)."""
    decoder, chunks, i = StreamDecoder(codec, config, condition=condition), [], 0
    for n in _bursts(seed, len(codes)):
        chunks += decoder.push(codes[i : i + n])
        i += n
    return chunks + decoder.finish()


async def test_concurrent_streams_get_their_own_unbatched_results() -> None:
    codec = RecordingCodec(context_frames=2)
    config = StreamConfig(first_frames=1, lookahead_frames=2, max_chunk_frames=8)
    rng = random.Random(0)
    streams = [[rng.randrange(100) for _ in range(rng.randint(1, 60))] for _ in range(12)]
    batcher = DecodeBatcher(codec, max_batch=5, max_wait_ms=20.0, max_pad_ratio=100.0)
    try:
        results = await asyncio.gather(
            *(_stream_through(batcher, codec, codes, s, config) for s, codes in enumerate(streams))
        )
    finally:
        await batcher.close()
    for seed, (codes, chunks) in enumerate(zip(streams, results, strict=True)):
        solo = _solo(FakeCodec(context_frames=2), codes, seed, config)
        np.testing.assert_array_equal(np.concatenate(chunks), np.concatenate(solo))
    stats = batcher.stats()
    assert stats["windows"] == sum(len(r) for r in results)
    assert stats["mean_batch_size"] > 1.5  # 12 streams stepping together share batches
    assert max(len(call) for call in codec.calls) <= 5
    assert codec.threads == {"veena-decode_0"}  # one worker thread, never the event loop


async def test_snac_windows_batched_across_streams_equal_unbatched(snac_random_dir: Path) -> None:
    from pipecat_veena.codecs.snac import SnacCodec

    codec = SnacCodec.from_pretrained(snac_random_dir)
    config = StreamConfig(first_frames=1, lookahead_frames=2, max_chunk_frames=4)
    rng = np.random.default_rng(0)
    streams = [rng.integers(0, 4096, size=7 * n).tolist() for n in (2, 5, 7)]
    batcher = DecodeBatcher(codec, max_batch=8, max_wait_ms=50.0, max_pad_ratio=100.0)
    try:
        results = await asyncio.gather(
            *(_stream_through(batcher, codec, codes, s, config) for s, codes in enumerate(streams))
        )
    finally:
        await batcher.close()
    assert batcher.stats()["mean_batch_size"] > 1.0
    for seed, (codes, chunks) in enumerate(zip(streams, results, strict=True)):
        solo = np.concatenate(_solo(codec, codes, seed, config))
        np.testing.assert_allclose(np.concatenate(chunks), solo, atol=1e-5)


async def test_bicodec_streams_with_their_own_globals_batched_equal_unbatched(
    tmp_path: Path,
) -> None:
    from pipecat_veena.codecs.bicodec import BiCodecCodec, write_random_checkpoint

    codec = BiCodecCodec.from_pretrained(write_random_checkpoint(tmp_path, "tiny", seed=1))
    config = StreamConfig(first_frames=2, lookahead_frames=4, max_chunk_frames=16)
    rng = np.random.default_rng(1)
    streams = [
        (rng.integers(0, 8192, size=n).tolist(), rng.integers(0, 4096, size=32))
        for n in (5, 30, 47, 60)
    ]
    batcher = DecodeBatcher(codec, max_batch=8, max_wait_ms=20.0, max_pad_ratio=100.0)
    try:
        results = await asyncio.gather(
            *(
                _stream_through(batcher, codec, codes, s, config, globals_)
                for s, (codes, globals_) in enumerate(streams)
            )
        )
    finally:
        await batcher.close()
    assert batcher.stats()["mean_batch_size"] > 1.0
    for seed, ((codes, globals_), chunks) in enumerate(zip(streams, results, strict=True)):
        solo = np.concatenate(_solo(codec, codes, seed, config, globals_))
        # float32 rounding only: batched matmuls sum in another order (peaks near 1.0)
        np.testing.assert_allclose(np.concatenate(chunks), solo, atol=3e-5)


def _window(n: int, value: int = 1, start: int = 0) -> CodecWindow:
    return CodecWindow(frames=np.full((n, 1), value, dtype=np.int64), start=start)


async def test_cancelled_waiter_does_not_break_the_others() -> None:
    codec = RecordingCodec()
    batcher = DecodeBatcher(codec, max_batch=4, max_wait_ms=1.0, max_pad_ratio=100.0)
    try:
        codec.gate.clear()
        first = asyncio.ensure_future(batcher.decode(_window(3)))  # taken by the worker, held
        await codec.started()
        queued = [asyncio.ensure_future(batcher.decode(_window(n))) for n in (1, 2, 3)]
        await asyncio.sleep(0)  # one loop turn: the three are queued behind the held batch
        queued[1].cancel()
        first.cancel()  # cancelled while its batch is being decoded
        codec.gate.set()
        done = await asyncio.gather(queued[0], queued[2])
        assert [len(a) for a in done] == [8, 24]
        assert queued[1].cancelled() and first.cancelled()
        np.testing.assert_array_equal(
            await batcher.decode(_window(2)), codec.decode_windows([_window(2)])[0]
        )
        assert codec.calls[:2] == [[3], [1, 3]]  # the cancelled 2-frame window was skipped
    finally:
        codec.gate.set()
        await batcher.close()


async def test_a_bad_window_fails_alone() -> None:
    batcher = DecodeBatcher(FakeCodec(), max_batch=8, max_wait_ms=20.0, max_pad_ratio=100.0)
    try:
        results = await asyncio.gather(
            batcher.decode(_window(2)),
            batcher.decode(_window(2, value=-1)),
            batcher.decode(_window(3)),
            return_exceptions=True,
        )
    finally:
        await batcher.close()
    assert isinstance(results[1], ValueError) and "negative code" in str(results[1])
    assert results[0].shape == (16,) and results[2].shape == (24,)


async def test_close_joins_the_worker_and_fails_waiting_decodes() -> None:
    codec = RecordingCodec()
    batcher = DecodeBatcher(codec, max_wait_ms=1.0)
    assert (await batcher.decode(_window(1))).shape == (8,)
    codec.gate.clear()
    codec.entered.clear()
    busy = asyncio.ensure_future(batcher.decode(_window(2)))
    await codec.started()  # the worker holds the busy window
    waiting = asyncio.ensure_future(batcher.decode(_window(3)))
    await asyncio.sleep(0)  # one loop turn: it is queued
    closing = asyncio.ensure_future(batcher.close())
    await asyncio.wait([busy, waiting], timeout=10)  # close() failed both before the gate opens
    codec.gate.set()
    await closing
    for task in (busy, waiting):
        with pytest.raises(RuntimeError, match="closed"):
            await task
    assert not [t for t in threading.enumerate() if t.name.startswith("veena-decode")]
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "veena-decode-batcher"]
    with pytest.raises(RuntimeError, match="closed"):
        await batcher.decode(_window(1))
    await batcher.close()  # idempotent


def test_group_by_length_bounds_padding() -> None:
    lengths = [4, 400, 5, 8, 9, 200, 1]
    groups = group_by_length(lengths, 2.0)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert max(lengths[i] for i in group) <= 2.0 * min(lengths[i] for i in group)
    assert group_by_length(lengths, 1000.0) == [[6, 0, 2, 3, 4, 5, 1]]


def test_batcher_validates_its_knobs() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        DecodeBatcher(FakeCodec(), max_batch=0)
