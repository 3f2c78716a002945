"""The upload workers: a small thread pool of their own for voice uploads and enrolment.

Decoding a clip and running the speaker encoder are CPU work that must never wait in, or hold,
the event loop's default thread pool, which speech uses (text normalisation, word timing).
``UploadWorkers`` runs that work on ``workers`` threads and admits at most ``admitted`` uploads
at once (those running plus those waiting for a thread); one more is refused at once with
``uploads_busy`` (HTTP 429, ``Retry-After``) instead of queueing without bound. The workers
run at a lower CPU priority (``nice`` +``WORKER_NICENESS`` on Linux, each thread alone), so a burst
of uploads yields the CPU to speech. The process has one pool (``upload_workers()``), shared by
the apps it serves.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from loguru import logger

from pipecat_veena.remote.protocol import ErrorCode, ProtocolError

T = TypeVar("T")

#: Threads decoding and enrolling uploads (at most; fewer on a 1-CPU machine).
UPLOAD_WORKERS = 2
#: Uploads admitted at once: running, or waiting for a worker. One more gets 429.
UPLOADS_ADMITTED = 4
#: How much nicer than the server's other threads an upload worker runs (Linux).
WORKER_NICENESS = 10


def _lower_priority() -> None:
    """Run this thread (alone: Linux schedules threads as tasks) ``WORKER_NICENESS`` nicer."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICENESS)
    except (AttributeError, OSError) as e:  # not Linux, or not allowed: run at normal priority
        logger.debug(f"upload workers: cannot lower their priority ({e})")


class UploadWorkers:
    """A bounded pool for upload work, with admission control.

    Args:
        workers: threads running upload work.
        admitted: uploads in progress at once (at least ``workers``).
    """

    def __init__(self, workers: int = UPLOAD_WORKERS, admitted: int = UPLOADS_ADMITTED) -> None:
        self.workers = max(1, min(workers, os.cpu_count() or 1))
        self.admitted = max(admitted, self.workers)
        self.executor: Executor = ThreadPoolExecutor(
            self.workers, "veena-upload", initializer=_lower_priority
        )
        self._lock = threading.Lock()
        self._in_progress = 0

    @property
    def in_progress(self) -> int:
        """Uploads admitted and not finished."""
        return self._in_progress

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one of the ``admitted`` places for the block.

        Raises:
            ProtocolError: ``uploads_busy`` when every place is taken.
        """
        with self._lock:
            if self._in_progress >= self.admitted:
                raise ProtocolError(
                    ErrorCode.UPLOADS_BUSY,
                    f"the server is already decoding or enrolling {self.admitted} voice "
                    "uploads: retry after the Retry-After seconds",
                )
            self._in_progress += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_progress -= 1

    async def run(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` on an upload worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, work, *args)


_pool: UploadWorkers | None = None
_pool_lock = threading.Lock()


def upload_workers() -> UploadWorkers:
    """The process's upload pool (made on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = UploadWorkers()
        return _pool
