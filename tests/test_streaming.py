"""The window scheduler (pure ints) and StreamDecoder's stitching, against a fake codec.

Covers: every frame emitted once and in order, window bounds, contexts as configured, linear
total work, first audio after F + R frames, the split plan/accept form equal to push, partial
frames, crossfades, counters and the errors of misuse. Real codecs: tests/test_streaming_codecs.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np
import pytest

from pipecat_veena.codecs.base import AudioCodec, CodecWindow
from pipecat_veena.streaming import StreamConfig, StreamDecoder, StreamScheduler


class FakeCodec(AudioCodec):
    """A fake codec (numpy, no torch) with a known receptive field, for stitching unit tests.

    Each frame of K codes becomes ``samples_per_frame`` samples of a tone whose level is a moving
    average of the frame values over ``context_frames`` frames on each side, zero past the window
    edges: so a window decode equals the full decode exactly when both contexts reach
    ``context_frames``, and differs otherwise (as a real convolutional decoder does).
    """

    sample_rate = 800
    samples_per_frame = 8
    condition_size = 0

    def __init__(self, context_frames: int = 2, codes_per_frame: int = 1) -> None:
        self.context_frames = context_frames
        self.codes_per_frame = codes_per_frame
        self.calls: list[list[int]] = []

    def decode_windows(self, windows: Sequence[CodecWindow]) -> list[np.ndarray]:
        self.calls.append([w.num_frames for w in windows])
        return [self.kept_audio(w, self._decode(w)) for w in windows]

    def _decode(self, window: CodecWindow) -> np.ndarray:
        if (window.frames < 0).any():
            raise ValueError("negative code")
        values = window.frames.sum(axis=1) / (100.0 * self.codes_per_frame)
        c = self.context_frames
        padded = np.pad(values, (c, c))
        kernel = np.arange(1, 2 * c + 2, dtype=np.float64)
        level = np.convolve(padded, kernel / kernel.sum(), mode="valid")  # (T,)
        tone = np.sin(np.arange(1, self.samples_per_frame + 1))
        return (level[:, None] * tone[None, :]).reshape(-1).astype(np.float32)


def _random_config(rng: random.Random, context: int) -> StreamConfig:
    first = rng.randint(1, 6)
    return StreamConfig(
        first_frames=first,
        lookahead_frames=rng.randint(0, 5),
        growth=rng.choice([1.0, 1.5, 2.0, 3.0]),
        max_chunk_frames=rng.randint(first, 40),
        left_context_frames=rng.choice([None, 0, 1, context + 3]),
    )


def _pushes(rng: random.Random, total: int) -> list[int]:
    """Random push sizes summing to ``total`` (single frames, bursts, and empty pushes)."""
    sizes = []
    while sum(sizes) < total:
        sizes.append(min(total - sum(sizes), rng.choice([0, 1, 1, 1, 2, 3, 7, 30])))
    return sizes


@pytest.mark.parametrize("seed", range(40))
def test_scheduler_properties_over_random_push_patterns(seed: int) -> None:
    rng = random.Random(seed)
    config = _random_config(rng, context=2)
    left = config.left_context_frames if config.left_context_frames is not None else 2
    total = rng.randint(0, 300)
    scheduler = StreamScheduler.from_config(config, left)
    windows, available = [], 0
    for size in _pushes(rng, total):
        available += size
        for w in scheduler.windows(available):
            assert w.context_end == w.emit_end + config.lookahead_frames <= available
            assert w.emit_end - w.emit_start >= min(config.first_frames, config.max_chunk_frames)
            windows.append(w)
    final = scheduler.windows(available, final=True)
    for w in final:
        assert w.context_end == min(available, w.emit_end + config.lookahead_frames)
    windows += final

    position = 0
    for w in windows:  # contiguous, in order, within bounds, contexts as configured
        assert w.emit_start == position
        assert 0 <= w.context_start <= w.emit_start < w.emit_end <= w.context_end <= total
        assert w.context_start == max(0, w.emit_start - left)
        assert w.emit_end - w.emit_start <= config.max_chunk_frames
        position = w.emit_end
    assert position == total
    assert scheduler.next_window(total, final=True) is None

    # Linear work: each window pays at most L + R extra, and the count of windows is bounded by
    # the growing targets plus total / max_chunk (final windows split at max_chunk).
    targets, target = [], config.first_frames
    while sum(targets) < total:
        targets.append(target)
        target = min(config.max_chunk_frames, max(target, int(target * config.growth)))
    bound = len(targets) + math.ceil(total / config.max_chunk_frames) + 1
    assert len(windows) <= bound
    work = sum(w.decode_frames for w in windows)
    assert work <= total + len(windows) * (left + config.lookahead_frames)


@pytest.mark.parametrize("seed", range(20))
def test_windows_depend_on_the_frames_not_on_how_they_arrive(seed: int) -> None:
    """The same frames pushed one by one or in bursts (vLLM groups tokens into bigger deltas
    when its reader lags) give the same windows, so the same seams and the same audio."""
    rng = random.Random(seed)
    config = _random_config(rng, context=2)
    total = rng.randint(0, 300)

    def plan(pushes: list[int]) -> list:
        scheduler = StreamScheduler.from_config(config, 2)
        windows, available = [], 0
        for size in pushes:
            available += size
            windows += scheduler.windows(available)
        return windows + scheduler.windows(available, final=True)

    assert plan(_pushes(rng, total)) == plan([1] * total)


def test_first_window_after_first_plus_lookahead_frames_then_growing_chunks() -> None:
    scheduler = StreamScheduler(
        first_frames=4, lookahead_frames=16, left_context_frames=67, growth=2.0, max_chunk_frames=32
    )
    first_at = None
    sizes = []
    for available in range(1, 200):
        for w in scheduler.windows(available):
            first_at = first_at or available
            sizes.append(w.emit_end - w.emit_start)
    assert first_at == 20
    assert sizes == [4, 8, 16, 32, 32, 32, 32]  # 156 frames: the next 32 need 204 available
    final = scheduler.windows(199, final=True)  # the rest, split at max_chunk, no lookahead left
    assert [(w.emit_start, w.emit_end, w.context_end) for w in final] == [
        (156, 188, 199),
        (188, 199, 199),
    ]


def test_scheduler_rejects_a_shrinking_or_post_final_count() -> None:
    scheduler = StreamScheduler(first_frames=1, lookahead_frames=0, left_context_frames=0)
    scheduler.windows(5)
    with pytest.raises(ValueError, match="running total"):
        scheduler.windows(4)
    scheduler.windows(6, final=True)
    with pytest.raises(ValueError, match="after the end of the stream"):
        scheduler.windows(7)


@pytest.mark.parametrize(
    "bad",
    [
        dict(first_frames=0),
        dict(growth=0.5),
        dict(lookahead_frames=-1),
        dict(first_frames=8, max_chunk_frames=4),
        dict(crossfade_samples=-1),
    ],
)
def test_stream_config_validates(bad: dict) -> None:
    with pytest.raises(ValueError):
        StreamConfig(**bad)


def _full_decode(codec: FakeCodec, codes: list[int]) -> np.ndarray:
    frames = np.array(codes, dtype=np.int64).reshape(-1, codec.codes_per_frame)
    return codec.decode_windows([CodecWindow(frames=frames)])[0]


@pytest.mark.parametrize("seed", range(12))
def test_stream_equals_offline_decode_when_contexts_cover_the_receptive_field(seed: int) -> None:
    rng = random.Random(seed)
    codec = FakeCodec(context_frames=2, codes_per_frame=rng.choice([1, 3]))
    fade = rng.choice([0, 3, 8])  # a fade takes up to one frame of the lookahead
    config = StreamConfig(
        first_frames=rng.randint(1, 4),
        lookahead_frames=rng.randint(2, 4) + (fade > 0),
        max_chunk_frames=rng.randint(4, 20),
        crossfade_samples=fade,
    )
    total_frames = rng.randint(1, 80)
    codes = [rng.randrange(100) for _ in range(total_frames * codec.codes_per_frame)]
    decoder = StreamDecoder(codec, config)
    chunks, fed = [], 0
    for size in _pushes(rng, len(codes)):  # sizes in codes: partial frames wait
        chunks += decoder.push(codes[fed : fed + size])
        fed += size
    chunks += decoder.finish()
    assert decoder.frames_decoded == sum(sum(call) for call in codec.calls) >= total_frames
    streamed = np.concatenate(chunks)
    assert streamed.dtype == np.float32
    np.testing.assert_allclose(streamed, _full_decode(codec, codes), atol=1e-6)
    assert decoder.frames_emitted == total_frames
    assert decoder.samples_emitted == total_frames * codec.samples_per_frame


def test_short_lookahead_is_inexact_and_counters_count_context() -> None:
    codec = FakeCodec(context_frames=3)
    codes = list(range(40))
    decoder = StreamDecoder(codec, StreamConfig(first_frames=2, lookahead_frames=1))
    streamed = np.concatenate(
        [c for code in codes for c in decoder.push([code])] + decoder.finish()
    )
    full = _full_decode(codec, codes)
    assert streamed.shape == full.shape
    assert np.abs(streamed - full).max() > 1e-3  # the right seam needs 3 frames, it got 1
    assert decoder.frames_decoded == sum(sum(call) for call in codec.calls[:-1])
    assert decoder.frames_decoded > decoder.frames_emitted == 40


def test_plan_decode_accept_equals_push() -> None:
    codec = FakeCodec(context_frames=2, codes_per_frame=2)
    config = StreamConfig(first_frames=1, lookahead_frames=1, max_chunk_frames=6)
    rng = random.Random(5)
    codes = [rng.randrange(100) for _ in range(2 * 37)]
    pushed, planned = StreamDecoder(codec, config), StreamDecoder(codec, config)
    out_push, out_plan = [], []
    for i in range(0, len(codes), 3):
        out_push += pushed.push(codes[i : i + 3])
        jobs = planned.plan(codes[i : i + 3])
        audios = codec.decode_windows([job.window for job in jobs])
        out_plan += [planned.accept(job, audio) for job, audio in zip(jobs, audios, strict=True)]
    out_push += pushed.finish()
    jobs = planned.plan_finish()
    out_plan += [
        planned.accept(j, a)
        for j, a in zip(jobs, codec.decode_windows([j.window for j in jobs]), strict=True)
    ]
    assert len(out_push) == len(out_plan)
    for a, b in zip(out_push, out_plan, strict=True):
        np.testing.assert_array_equal(a, b)
    assert pushed.frames_decoded == planned.frames_decoded


def test_accept_enforces_order_and_shape() -> None:
    codec = FakeCodec()
    decoder = StreamDecoder(codec, StreamConfig(first_frames=1, lookahead_frames=0, growth=1.0))
    jobs = decoder.plan(list(range(3)))
    assert [job.span.emit_end for job in jobs] == [1, 2, 3]  # one target-sized chunk each
    more = decoder.plan([5])
    with pytest.raises(ValueError, match="keep order"):
        decoder.accept(more[0], codec.decode_windows([more[0].window])[0])
    with pytest.raises(ValueError, match="expected"):
        decoder.accept(jobs[0], np.zeros(5, dtype=np.float32))


def test_incomplete_last_frame_is_dropped_and_push_after_finish_fails() -> None:
    codec = FakeCodec(codes_per_frame=7)
    decoder = StreamDecoder(codec, StreamConfig(first_frames=1, lookahead_frames=1))
    chunks = decoder.push(list(range(7 * 3 + 4)))
    chunks += decoder.finish()
    assert sum(len(c) for c in chunks) == 3 * codec.samples_per_frame
    with pytest.raises(ValueError, match="after finish"):
        decoder.push([1])


def test_condition_is_checked_against_the_codec() -> None:
    codec = FakeCodec()
    with pytest.raises(ValueError, match="takes no condition"):
        StreamDecoder(codec, condition=[1, 2])
    codec.condition_size = 32
    with pytest.raises(ValueError, match="32 ids"):
        StreamDecoder(codec, condition=[1, 2])
    decoder = StreamDecoder(
        codec, StreamConfig(first_frames=1, lookahead_frames=0), condition=list(range(32))
    )
    assert decoder.plan([1])[0].window.condition.tolist() == list(range(32))


def test_crossfade_longer_than_the_lookahead_is_refused() -> None:
    codec = FakeCodec()
    with pytest.raises(ValueError, match="lookahead"):
        StreamDecoder(codec, StreamConfig(first_frames=2, lookahead_frames=1, crossfade_samples=9))


def test_for_codec_falls_back_to_the_receptive_field_for_unknown_codecs() -> None:
    config = StreamConfig.for_codec(FakeCodec(context_frames=5))
    assert config.lookahead_frames == 5 and config.left_context_frames is None
    assert config.left_context(FakeCodec(context_frames=5)) == 5
