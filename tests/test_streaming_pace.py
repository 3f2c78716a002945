"""Chunk pacing against a virtual clock: growing chunks alone starve a listener when the LLM is
slower than ``growth`` x real time; with ``should_hurry`` any LLM faster than real time plays
without gaps, at a bounded decode cost. Pure integers and floats: no codec, no engine (the
engine's own rule is called on a plain namespace)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from pipecat_veena.engine.utterance import Utterance
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


def test_no_chunk_exceeds_its_target_however_far_ahead_the_llm_is():
    sched = StreamScheduler(first_frames=4, lookahead_frames=0, left_context_frames=0)
    assert sched.next_window(4).emit_end == 4  # target now 8
    # 96 more frames at once, the listener starving: the due target and the grown ones, then
    # the rest (40 >= the previous 32: no wait for 64), not all 96 in one long decode.
    sizes = [w.emit_end - w.emit_start for w in sched.windows(100, urgent=True)]
    assert sizes == [8, 16, 32, 40]
    # The final flush goes on in targets too; its last chunk takes the rest.
    sizes = [w.emit_end - w.emit_start for w in sched.windows(300, final=True)]
    assert sizes == [64, 128, 8] and sched.emitted == 300


def test_should_hurry():
    assert not should_hurry(1.0, 0, 100.0, 0.3)  # a chunk is due anyway
    assert should_hurry(0.5, 40, 100.0, 0.3)  # 0.5 s left, 0.4 s to wait
    assert not should_hurry(2.0, 40, 100.0, 0.3)
    assert should_hurry(0.5, 40, 100.0, 0.3, real_time_fps=50.0)
    assert not should_hurry(0.5, 40, 40.0, 0.3, real_time_fps=50.0)  # slower than real time


def _simulate_decoding(
    speed: float, *, hurry: bool, fixed_s: float, per_frame_s: float, seconds: float = 8.0
) -> list[tuple[float, float]]:
    """Like ``_simulate``, but each window takes ``fixed_s + per_frame_s * emitted_frames`` to
    decode, one at a time, and the stream waits for it (as ``Utterance`` does), with the
    engine's margin (``min_buffer_s`` 0.05 or 1.5x the last decode). Returns the listener's
    gaps as (audio position s, gap s)."""
    sched = StreamScheduler(
        first_frames=4, lookahead_frames=16, left_context_frames=67, growth=2.0,
        max_chunk_frames=1024,
    )  # fmt: skip
    total, gen_fps = int(seconds * FPS), speed * FPS
    now, emitted_s, first_audio_at, last_decode = 0.0, 0.0, None, 0.0
    gaps = []
    while sched.emitted < total:
        available = min(total, int(now * gen_fps + 1e-9))
        final = available == total
        urgent = False
        if hurry and first_audio_at is not None and not final:
            margin = max(0.05, 1.5 * last_decode)
            buffered = emitted_s - (now - first_audio_at)
            urgent = should_hurry(buffered, sched.frames_until_due(available), gen_fps, margin)
        window = sched.next_window(available, final=final, urgent=urgent)
        if window is None:
            now = (available + 1) / gen_fps  # the next frame's arrival
            continue
        last_decode = fixed_s + per_frame_s * (window.emit_end - window.emit_start)
        now += last_decode
        if first_audio_at is None:
            first_audio_at = now
        playhead = first_audio_at + emitted_s
        if now > playhead + 1e-9:
            gaps.append((emitted_s, now - playhead))
            first_audio_at += now - playhead
        emitted_s += (window.emit_end - window.emit_start) / FPS
    return gaps


@pytest.mark.parametrize("load", [1.0, 2.0], ids=["idle", "busy"])
def test_hurrying_pays_even_when_small_chunks_decode_slower_than_real_time(load):
    """The real-size BiCodec on a 2-core CPU, bf16 (measured: an 80 ms chunk costs 100 ms to
    decode, mostly the codec's fixed context, and 3.7 ms per further frame; twice that on a
    busy machine) behind an LLM at 1.44x real time. Waiting for each doubled chunk starves the
    listener at every doubling; hurrying (a chunk never smaller than the previous one) keeps
    the gaps to the first second."""
    cost = dict(fixed_s=0.085 * load, per_frame_s=0.0037 * load)
    late = [g for g in _simulate_decoding(1.44, hurry=False, **cost) if g[0] >= 1.0]
    assert len(late) >= 2 and sum(g for _, g in late) > 0.8
    assert [g for g in _simulate_decoding(1.44, hurry=True, **cost) if g[0] >= 1.0] == []


def _utterance_state(*, seed=None, last_decode_s: float, speed: float = 1.0) -> SimpleNamespace:
    """What ``Utterance._urgent`` reads: 80 ms played from a first chunk of 80 ms just now, the
    LLM at 72 frames/s, 8 frames still to come before the next regular chunk."""
    now = time.monotonic()
    return SimpleNamespace(
        options=SimpleNamespace(seed=seed),
        first_audio_at=now,
        first_code_at=now - 1.0,
        samples=1280,  # 80 ms at 16 kHz
        codec=SimpleNamespace(sample_rate=16000, frame_rate=50.0),
        decoder=SimpleNamespace(frames_until_due=8, frames_received=72),
        last_decode_s=last_decode_s,
        config=SimpleNamespace(min_buffer_s=0.05),
        speed=speed,
    )


def test_the_engine_hurries_even_after_a_decode_slower_than_its_chunk():
    """80 ms buffered, 111 ms until the next chunk is due: hurry, however long the last (small)
    chunk took to decode; never for a seeded request (its chunks follow its tokens alone)."""
    assert Utterance._urgent(_utterance_state(last_decode_s=0.01))
    assert Utterance._urgent(_utterance_state(last_decode_s=0.25))  # 3x its 80 ms
    assert not Utterance._urgent(_utterance_state(seed=1, last_decode_s=0.01))
    slow = _utterance_state(last_decode_s=0.01)
    slow.decoder.frames_received = 40  # 40 frames/s: slower than real time, dry anyway
    assert not Utterance._urgent(slow)


def test_hurrying_reckons_with_the_playback_speed():
    """At speed 2 the listener plays the 80 ms buffered in 40 ms, and real time is 100 frames/s:
    a chunk 2 frames away (13 ms at 150 frames/s) is worth hurrying for at 2.0, not at 1.0."""
    fast = _utterance_state(last_decode_s=0.01, speed=2.0)
    fast.decoder.frames_until_due, fast.decoder.frames_received = 2, 150
    assert Utterance._urgent(fast)
    fast.speed = 1.0
    assert not Utterance._urgent(fast)
    fast.speed, fast.decoder.frames_received = 2.0, 90  # slower than real time at 2x: dry anyway
    assert not Utterance._urgent(fast)


@pytest.mark.parametrize("seconds", [8.0, 15.0])
def test_an_llm_far_ahead_of_a_busy_codec_starves_the_listener_only_at_the_start(seconds):
    """vLLM's CPU engine generates the demo LLM at 4-5x real time while the codec decodes at
    about half real time beside it: an urgent chunk that took every frame waiting (100-150
    frames, seconds of decode) left the listener dry after the first second
    (BENCHMARKS.md, playground); chunks held to their targets do not."""
    gaps = _simulate_decoding(8.0, hurry=True, fixed_s=0.17, per_frame_s=0.0074, seconds=seconds)
    late = [g for pos, g in gaps if pos >= 1.0]
    assert sum(late) < 0.05, gaps
