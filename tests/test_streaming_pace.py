"""Chunk pacing against a virtual clock: growing chunks alone starve a listener when the LLM is
slower than ``growth`` x real time; with ``should_hurry`` any LLM faster than real time plays
without gaps, at a bounded decode cost. Pure integers and floats: no codec, no engine."""

from __future__ import annotations

import pytest

from pipecat_veena.streaming import StreamScheduler, should_hurry

FPS = 50.0  # BiCodec frames per second of audio


def _simulate(speed: float, *, hurry: bool, seconds: float = 60.0, margin: float = 0.3):
    """Frames arrive at ``speed`` x real time, decoding is instant: (gap s, chunks, work)."""
    sched = StreamScheduler(
        first_frames=4, lookahead_frames=16, left_context_frames=67, growth=2.0,
        max_chunk_frames=1024,
    )  # fmt: skip
    total = int(seconds * FPS)
    gen_fps = speed * FPS
    emitted_s, first_audio_at, gap, work = 0.0, None, 0.0, 0
    for available in range(1, total + 1):
        now = available / gen_fps
        final = available == total
        urgent = False
        if first_audio_at is not None and not final:
            played = now - first_audio_at
            urgent = hurry and should_hurry(
                emitted_s - played, sched.frames_until_due(available), gen_fps, margin
            )
        for w in sched.windows(available, final=final, urgent=urgent):
            if first_audio_at is None:
                first_audio_at = now
            playhead = first_audio_at + emitted_s  # when this chunk's first sample plays
            gap += max(0.0, now - playhead)
            emitted_s += (w.emit_end - w.emit_start) / FPS
            first_audio_at += max(0.0, now - playhead)  # a gap delays everything after it
            work += w.decode_frames
    assert sched.emitted == total
    return gap, sched.chunks, work / total


@pytest.mark.parametrize("speed", [1.2, 1.5, 1.9])
def test_growth_alone_starves_a_listener_below_growth_x_real_time(speed):
    gap, _, _ = _simulate(speed, hurry=False)
    assert gap > 0.5


@pytest.mark.parametrize("speed", [1.2, 1.5, 1.9, 3.0, 10.0])
def test_hurrying_keeps_playback_gapless_above_real_time(speed):
    gap, chunks, work = _simulate(speed, hurry=True)
    assert gap == pytest.approx(0.0, abs=0.02)
    assert work < 2.5


def test_hurrying_costs_little_when_the_llm_is_fast():
    plain = _simulate(10.0, hurry=False)
    assert _simulate(10.0, hurry=True, margin=0.0)[1:] == plain[1:]  # never needed
    _, chunks, work = _simulate(10.0, hurry=True, margin=0.3)  # start-up buffer kept >= 0.3 s
    assert chunks <= plain[1] + 5 and work <= plain[2] + 0.1


def test_urgent_chunks_do_not_grow_the_target():
    sched = StreamScheduler(first_frames=4, lookahead_frames=0, left_context_frames=0)
    assert sched.next_window(4).emit_end == 4  # target now 8, previous 4
    assert sched.next_window(9, urgent=True).emit_end == 9  # 5 ready >= previous 4
    assert sched.frames_until_due(9) == 9 + 8 - 9
    assert sched.next_window(12, urgent=True) is None  # 3 < previous 4
    assert sched.next_window(17).emit_end == 17  # the 8-frame target, now reached


def test_should_hurry():
    assert not should_hurry(1.0, 0, 100.0, 0.3)  # a chunk is due anyway
    assert should_hurry(0.5, 40, 100.0, 0.3)  # 0.5 s left, 0.4 s to wait
    assert not should_hurry(2.0, 40, 100.0, 0.3)
