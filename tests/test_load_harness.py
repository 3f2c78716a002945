"""benchmarks/load.py, the load and fault harness: its player model, its figures, and one short
run against a real server (over the fake engine) with a stall, barge-ins and an injected fault.
"""

from __future__ import annotations

import sys

import pytest
from server_fakes import ROOT, FakeSpeechEngine, serving

sys.path.insert(0, str(ROOT))

from benchmarks._load_calls import CallPlan, CallResult, Utterance, longest_underrun  # noqa: E402
from benchmarks.load import plot, run_level, summarize, table  # noqa: E402


def test_a_player_fed_in_time_never_starves():
    # 100 ms chunks arriving every 100 ms (or faster) play without a gap
    assert longest_underrun([(t * 0.1, 0.1) for t in range(20)]) == pytest.approx(0.0)
    assert longest_underrun([(0.0, 0.1)] + [(0.05, 0.1)] * 10) == 0.0
    assert longest_underrun([]) == 0.0


def test_the_longest_stall_is_measured_from_when_the_audio_ran_out():
    # 0.3 s of audio by t=0.05, then nothing until t=0.8: silent from 0.3 to 0.8
    arrivals = [(0.0, 0.1), (0.02, 0.1), (0.05, 0.1), (0.8, 0.1), (0.95, 0.1), (1.3, 0.1)]
    assert longest_underrun(arrivals) == pytest.approx(0.5)
    # from 0.8: runs out at 0.9, the chunk at 0.95 plays to 1.05, the next comes at 1.3
    assert longest_underrun(arrivals[3:]) == pytest.approx(0.25)
    # a jitter buffer of 0.5 s absorbs the first gap (playing from 0.5, out at 0.8), not the last
    assert longest_underrun(arrivals, prebuffer_s=0.5) == pytest.approx(0.25)
    assert longest_underrun(arrivals[:4], prebuffer_s=0.5) == pytest.approx(0.0)


def test_summary_and_table():
    calls = [
        CallResult(0, [Utterance(0, "completed", 0.1, 2.0, 0.5, 0.0)], retries=1),
        CallResult(1, [Utterance(1, "cancelled", 0.2, 0.5, 0.3, 0.25),
                       Utterance(1, "error", None, 0.0, 0.1, error="RemoteError: tts-3: gone")]),
    ]  # fmt: skip
    before = {"r1": {"requests": 10.0}}
    after = {"r1": {"requests": 12.0}, "r2": {"requests": 1.0}}
    s = summarize(calls, calls=2, wall_s=10.0, before=before, after=after)
    assert s["outcomes"] == {"completed": 1, "cancelled": 1, "error": 1}
    assert s["ttfa_ms"]["p50"] == pytest.approx(100) and s["ttfa_ms"]["p99"] == pytest.approx(200)
    assert s["rtf"]["p50"] == pytest.approx(0.25)
    assert s["underrun_ms"] == {"p50": 0.0, "p95": 250.0, "max": 250.0}
    assert s["buffered_underrun_ms"] == {"p95": 0.0, "max": 0.0}
    assert s["calls_with_underrun_over_100ms"] == 1 and s["retries"] == 1
    assert s["audio_s_per_s"] == 0.25
    assert s["errors"] == {"RemoteError: …: gone": 1}  # ids folded, so errors group
    assert s["requests_per_server"] == {"r1": 2, "r2": 1}
    text = table([s | {"left_running": 0.0}])
    assert "| 2 | 1 / 1 / 1 / 0 | 100 / 200 / 200 | 0.25 / 0.25 | 0 / 250 / 250 | 0 / 0 |" in text
    assert "r1: 2, r2: 1" in text
    assert "1 x `RemoteError: …: gone`" in text


async def test_a_short_run_against_a_server(tmp_path):
    # 0.1 s chunks every 0.15 s: playback starves for ~50 ms before each chunk after the first
    engine = FakeSpeechEngine(chunks=4, chunk_samples=1600, delay=0.15)
    plan = CallPlan(pause_s=(0.05, 0.1), barge_in=0.3, barge_in_after_s=(0.05, 0.1))
    faults = []

    async def fault() -> str:
        faults.append(1)
        return "nothing, really"

    async with serving(engine) as handle:
        level = await run_level(
            handle.url, 3, 2.5, plan, seed=1, fault=fault, fault_at_s=1.0, progress=False
        )
    outcomes = level["outcomes"]
    assert outcomes.get("completed", 0) > 3 and outcomes.get("cancelled", 0) > 0
    assert "error" not in outcomes and "hung" not in outcomes and not level["errors"]
    assert level["underrun_ms"]["max"] == pytest.approx(50, abs=30)
    assert level["buffered_underrun_ms"]["max"] == pytest.approx(0, abs=30)  # 200 ms absorb it
    assert level["ttfa_ms"]["p50"] == pytest.approx(150, abs=60)
    assert level["left_running"] == 0 and not engine.open  # every cancel reached the engine
    total = sum(outcomes.values())
    assert level["requests_per_server"] == {"server": total}
    assert faults == [1] and level["fault"].startswith("nothing, really at 1.")
    path = plot({"test": [level]}, tmp_path / "load.png", "a test")
    assert path.stat().st_size > 1000
