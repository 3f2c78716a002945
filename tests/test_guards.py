"""The repetition guard trips on loops and drones, never on varied streams."""

import numpy as np
import pytest

from pipecat_veena.engine.guards import RepetitionGuard


def test_trips_on_a_short_loop():
    guard = RepetitionGuard(window=150, max_period=25)
    rng = np.random.default_rng(0)
    assert not guard.feed(rng.integers(0, 8192, 200).tolist())
    loop = [11, 12, 13, 14, 15]
    tripped_at = None
    for i in range(100):
        if guard.feed(loop):
            tripped_at = i
            break
    assert tripped_at is not None and guard.period == 5
    assert 150 <= (tripped_at + 1) * 5 <= 150 + 16 + 5


def test_trips_on_a_drone():
    guard = RepetitionGuard(window=100, max_period=10)
    assert any(guard.feed([42]) for _ in range(200))
    assert guard.period == 1 and guard.tripped


def test_random_codes_never_trip():
    guard = RepetitionGuard(window=150, max_period=25)
    rng = np.random.default_rng(1)
    assert not any(guard.feed(rng.integers(0, 8192, 7).tolist()) for _ in range(2000))


def test_bad_parameters():
    with pytest.raises(ValueError, match="max_period"):
        RepetitionGuard(window=10, max_period=10)
