"""Micro-batching of codec decodes across concurrent streams: bounded wait, one worker thread.

Streams ``await batcher.decode(window)``; the batcher collects windows for at most ``max_wait_ms``
after the oldest one arrived (or until ``max_batch`` are waiting), then decodes them with
``codec.decode_windows`` on its single worker thread, so torch work never runs on the event loop
and never runs twice at once. Windows of very different lengths go in separate codec calls (padding
a 4-frame window to 400 frames would waste the compute batching saves). A window the codec rejects
fails alone: the rest of its batch is decoded again without it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipecat_veena.codecs.base import AudioCodec, CodecWindow
from pipecat_veena.errors import EngineNotRunningError
from pipecat_veena.logs import log_failure
from pipecat_veena.tasks import cancel_and_wait


@dataclass
class _Request:
    window: CodecWindow
    future: asyncio.Future
    enqueued: float


class DecodeBatcher:
    """Decodes windows from concurrent asyncio streams in batches; results equal unbatched ones.

    Bound to the event loop of its first ``decode`` call. ``await close()`` when done.
    """

    def __init__(
        self,
        codec: AudioCodec,
        *,
        max_batch: int = 16,
        max_wait_ms: float = 2.0,
        max_pad_ratio: float = 2.0,
    ) -> None:
        if max_batch < 1 or max_wait_ms < 0 or max_pad_ratio < 1:
            raise ValueError(
                f"need max_batch >= 1, max_wait_ms >= 0, max_pad_ratio >= 1; got {max_batch}, "
                f"{max_wait_ms}, {max_pad_ratio}"
            )
        self.codec = codec
        self._max_batch = max_batch
        self._max_wait = max_wait_ms / 1000.0
        self._max_pad_ratio = max_pad_ratio
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="veena-decode")
        self._pending: deque[_Request] = deque()
        self._inflight: list[_Request] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._full: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        self._closed = False
        self._stats = {"batches": 0, "windows": 0, "frames": 0, "codec_calls": 0}
        self._sizes: Counter[int] = Counter()  # batches by size
        self._decode_seconds = 0.0

    async def decode(self, window: CodecWindow) -> np.ndarray:
        """Decode one window (batched with other streams' windows).

        Args:
            window: the frames to decode, as for ``codec.decode_windows``.

        Returns:
            float32 (T * samples_per_frame,) at the codec rate, as decoding it alone.
        """
        if self._closed:
            raise EngineNotRunningError("the decoder is closed: the engine shut down")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._wake = loop, asyncio.Event()
            self._task = loop.create_task(self._collect(), name="veena-decode-batcher")
        elif loop is not self._loop:
            raise RuntimeError("DecodeBatcher used from a second event loop: one per loop")
        request = _Request(window, loop.create_future(), loop.time())
        self._pending.append(request)
        self._wake.set()
        if len(self._pending) >= self._max_batch and self._full and not self._full.done():
            self._full.set_result(None)
        return await request.future

    def stats(self) -> dict[str, Any]:
        """Counters: batches, windows, frames, codec_calls, decode_seconds, mean_batch_size.

        ``batch_sizes`` maps each batch size to how many batches had it.
        """
        batches = self._stats["batches"]
        return {
            **self._stats,
            "decode_seconds": self._decode_seconds,
            "mean_batch_size": self._stats["windows"] / batches if batches else 0.0,
            "batch_sizes": dict(self._sizes),
        }

    async def close(self) -> None:
        """Stop collecting, fail waiting decodes, and join the worker thread (idempotent)."""
        self._closed = True
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        self._fail_all(EngineNotRunningError("the decoder closed: the engine shut down"))
        await asyncio.to_thread(self._executor.shutdown, True)

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wake.wait()
                if not self._pending:
                    self._wake.clear()
                    continue
                remaining = self._pending[0].enqueued + self._max_wait - loop.time()
                if len(self._pending) < self._max_batch and remaining > 0:
                    self._full = loop.create_future()
                    await asyncio.wait([self._full], timeout=remaining)
                    self._full = None
                batch = [
                    self._pending.popleft() for _ in range(min(self._max_batch, len(self._pending)))
                ]
                if not self._pending:
                    self._wake.clear()
                self._inflight = [r for r in batch if not r.future.done()]  # drop cancelled
                if not self._inflight:
                    continue
                windows = [r.window for r in self._inflight]
                results = await loop.run_in_executor(self._executor, self._decode, windows)
                for request, result in zip(self._inflight, results, strict=True):
                    if request.future.done():
                        continue
                    if isinstance(result, Exception):
                        request.future.set_exception(result)
                    else:
                        request.future.set_result(result)
                self._stats["batches"] += 1
                self._stats["windows"] += len(windows)
                self._sizes[len(windows)] += 1
                self._stats["frames"] += sum(w.num_frames for w in windows)
                self._inflight = []
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug here must not leave streams hanging
            log_failure("decode batcher failed", e)
            self._closed = True
            self._fail_all(RuntimeError(f"decode batcher failed: {e!r}"))

    def _decode(self, windows: list[CodecWindow]) -> list[np.ndarray | Exception]:
        """Worker thread: decode length groups; a failing group is retried window by window."""
        results: list[np.ndarray | Exception] = [RuntimeError("not decoded")] * len(windows)
        start = time.perf_counter()
        for group in group_by_length([w.num_frames for w in windows], self._max_pad_ratio):
            try:
                self._stats["codec_calls"] += 1
                audios = self.codec.decode_windows([windows[i] for i in group])
                for i, audio in zip(group, audios, strict=True):
                    results[i] = audio
            except Exception as e:
                if len(group) == 1:
                    results[group[0]] = e
                    continue
                for i in group:  # isolate the bad window: the others still get their audio
                    try:
                        self._stats["codec_calls"] += 1
                        results[i] = self.codec.decode_windows([windows[i]])[0]
                    except Exception as single_error:
                        results[i] = single_error
        self._decode_seconds += time.perf_counter() - start
        return results

    def _fail_all(self, error: Exception) -> None:
        for request in [*self._inflight, *self._pending]:
            if not request.future.done():
                request.future.set_exception(error)
        self._inflight, self._pending = [], deque()


def group_by_length(lengths: list[int], max_pad_ratio: float) -> list[list[int]]:
    """Split indices into groups whose longest window is at most ``max_pad_ratio`` x the shortest.

    Args:
        lengths: frames of each window.
        max_pad_ratio: bound on padded / real frames per row (>= 1).

    Returns:
        Index groups, shortest windows first; every index appears once.
    """
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if groups and lengths[i] <= max_pad_ratio * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
