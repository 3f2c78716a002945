"""The repetition guard trips on loops and drones, never on varied streams, and where it trips
depends only on the codes, not on how they arrive."""

import numpy as np
import pytest

from pipecat_veena.engine.guards import RepetitionGuard


def _stream(seed: int) -> list[int]:
    """200 random codes, then a five-code loop."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 8192, 200).tolist() + [11, 12, 13, 14, 15] * 60


def _kept(guard: RepetitionGuard, codes: list[int], sizes: list[int]) -> list[int]:
    """Feed ``codes`` in pieces of the given sizes (cycled); return what the guard kept."""
    kept, i, n = [], 0, 0
    while i < len(codes):
        piece = codes[i : i + sizes[n % len(sizes)]]
        kept += piece[: guard.feed(piece)]
        i, n = i + len(piece), n + 1
    return kept


def test_trips_on_a_short_loop():
    guard = RepetitionGuard(window=150, max_period=25)
    codes = _stream(0)
    kept = _kept(guard, codes, [5])
    assert guard.tripped and guard.period == 5
    # the first check whose window is all loop: 200 + 150 codes, rounded up to a check
    assert len(kept) == 352 and kept == codes[:352]
    assert guard.feed([1, 2, 3]) == 0  # tripped: nothing more is kept


def test_the_cut_does_not_depend_on_how_codes_arrive():
    codes = _stream(1)
    cuts = set()
    for sizes in ([1], [7], [16], [3, 40, 1], [500], [13, 2, 29]):
        guard = RepetitionGuard(window=150, max_period=25)
        cuts.add(len(_kept(guard, codes, sizes)))
        assert guard.period == 5
    assert cuts == {352}


def test_checks_fall_on_whole_frames():
    guard = RepetitionGuard(window=147, max_period=21, check_every=21)  # 7 codes a frame
    kept = _kept(guard, [5] * 400, [9])
    assert guard.period == 1 and len(kept) == 147 and len(kept) % 7 == 0


def test_trips_on_a_drone():
    guard = RepetitionGuard(window=100, max_period=10)
    assert any(guard.feed([42]) == 0 for _ in range(200))
    assert guard.period == 1 and guard.tripped


def test_random_codes_never_trip():
    guard = RepetitionGuard(window=150, max_period=25)
    rng = np.random.default_rng(1)
    for _ in range(2000):
        codes = rng.integers(0, 8192, 7).tolist()
        assert guard.feed(codes) == 7
    assert not guard.tripped


def test_bad_parameters():
    with pytest.raises(ValueError, match="max_period"):
        RepetitionGuard(window=10, max_period=10)
    with pytest.raises(ValueError, match="check_every"):
        RepetitionGuard(window=10, max_period=5, check_every=0)
