"""Guards against runaway generation: a code stream that loops on itself."""

from __future__ import annotations

import numpy as np


class RepetitionGuard:
    """Trips when the last ``window`` codes repeat with a short period (a loop or a drone).

    Checked with numpy at every ``check_every``-th code of the stream, counted from its start,
    however the codes arrive: where it trips then depends only on the codes, not on how many
    the engine delivered at a time, so a seeded request cut by the guard is cut at the same
    code in a batch as alone. The cost per generated token stays a fraction of a microsecond.

    Args:
        window: how many trailing codes must be periodic (e.g. 3 s of audio).
        max_period: the longest period, in codes, that counts as a loop.
        check_every: codes between checks (a whole number of frames keeps the cut on a frame).
    """

    def __init__(self, window: int, max_period: int, check_every: int = 16) -> None:
        if not 0 < max_period < window:
            raise ValueError(f"need 0 < max_period < window, got {max_period} and {window}")
        if check_every < 1:
            raise ValueError(f"need check_every >= 1, got {check_every}")
        self._window = window
        self._max_period = max_period
        self._check_every = check_every
        self._codes: list[int] = []  # the last codes fed (at most window + one feed)
        self._count = 0  # codes fed in all
        self.period: int | None = None

    @property
    def tripped(self) -> bool:
        """True once a loop was found."""
        return self.period is not None

    def feed(self, codes: list[int]) -> int:
        """Add codes; return how many of them to keep.

        All of them while the stream is not looping. When a check inside ``codes`` finds a loop,
        the codes up to that check (the rest are dropped: they would only lengthen the loop);
        0 once tripped.
        """
        if self.period is not None:
            return 0
        start = self._count
        self._codes.extend(codes)
        self._count += len(codes)
        every = self._check_every
        first = max(self._window, start + 1)
        for end in range(-(-first // every) * every, self._count + 1, every):
            stop = len(self._codes) - (self._count - end)  # the check's end in the buffer
            period = self._period(np.asarray(self._codes[stop - self._window : stop]))
            if period is not None:
                self.period = period
                self._codes.clear()
                return end - start
        del self._codes[: -self._window]
        return len(codes)

    def _period(self, tail: np.ndarray) -> int | None:
        """The shortest period up to ``max_period`` that ``tail`` repeats with, if any."""
        for period in range(1, self._max_period + 1):
            if np.array_equal(tail[period:], tail[:-period]):
                return period
        return None
