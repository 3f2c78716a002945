"""Guards against runaway generation: a code stream that loops on itself."""

from __future__ import annotations

import numpy as np


class RepetitionGuard:
    """Trips when the last ``window`` codes repeat with a short period (a loop or a drone).

    Checked every ``check_every`` codes with numpy, so the cost per generated token stays at a
    fraction of a microsecond.

    Args:
        window: how many trailing codes must be periodic (e.g. 3 s of audio).
        max_period: the longest period, in codes, that counts as a loop.
        check_every: codes between checks.
    """

    def __init__(self, window: int, max_period: int, check_every: int = 16) -> None:
        if not 0 < max_period < window:
            raise ValueError(f"need 0 < max_period < window, got {max_period} and {window}")
        self._window = window
        self._max_period = max_period
        self._check_every = check_every
        self._codes: list[int] = []
        self._since_check = 0
        self.period: int | None = None

    @property
    def tripped(self) -> bool:
        """True once a loop was found."""
        return self.period is not None

    def feed(self, codes: list[int]) -> bool:
        """Add codes; return True when the stream is looping."""
        if self.period is not None:
            return True
        self._codes.extend(codes)
        self._since_check += len(codes)
        if self._since_check < self._check_every or len(self._codes) < self._window:
            return False
        self._since_check = 0
        del self._codes[: -self._window - self._max_period]
        tail = np.asarray(self._codes[-self._window :])
        for period in range(1, self._max_period + 1):
            if np.array_equal(tail[period:], tail[:-period]):
                self.period = period
                return True
        return False
