"""SnacCodec on a random SNAC 24 kHz checkpoint: layout, receptive field, noise, batching and
kept spans."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import snac
import torch

from pipecat_veena.codecs.base import CodecWindow  # noqa: E402
from pipecat_veena.codecs.snac import (  # noqa: E402
    SNAC_24KHZ_CONFIG,
    SnacCodec,
    write_random_checkpoint,
)
from pipecat_veena.errors import CheckpointError  # noqa: E402


@pytest.fixture(scope="module")
def codec(snac_random_dir: Path) -> SnacCodec:
    return SnacCodec.from_pretrained(snac_random_dir, noise=False)


@pytest.fixture(scope="module")
def noisy(snac_random_dir: Path) -> SnacCodec:
    return SnacCodec.from_pretrained(snac_random_dir)


def _frames(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4096, size=(n, 7))


def _window_error(codec: SnacCodec, frames: np.ndarray, context: int) -> float:
    """Largest error of frames [4, 6) decoded with ``context`` frames each side vs the full."""
    spf = codec.samples_per_frame
    full = codec.decode_windows([CodecWindow(frames)])[0]
    lo, hi = 4 - context, 6 + context
    part = codec.decode_windows([CodecWindow(frames[lo:hi], start=lo)])[0]
    return float(np.abs(part[context * spf : (context + 2) * spf] - full[4 * spf : 6 * spf]).max())


def test_numbers_come_from_the_config(codec: SnacCodec) -> None:
    assert codec.sample_rate == 24000
    assert codec.samples_per_frame == 2048
    assert codec.codes_per_frame == 7 and codec.condition_size == 0
    assert codec.context_frames == 3  # derived from the layers, checked below by decoding


def test_deinterleaves_the_orpheus_layout(codec: SnacCodec) -> None:
    frames = np.arange(14).reshape(2, 7)
    levels = codec.frames_to_levels(frames)
    assert [lv.tolist() for lv in levels] == [[0, 7], [1, 4, 8, 11], [2, 3, 5, 6, 9, 10, 12, 13]]


def test_decode_matches_the_reference_snac_decode(codec: SnacCodec, snac_random_dir: Path) -> None:
    reference = snac.SNAC.from_pretrained(str(snac_random_dir))
    for block in reference.decoder.model:  # the reference's noise is random: switch it off
        for i, layer in enumerate(getattr(block, "block", [])):
            if type(layer).__name__ == "NoiseBlock":
                block.block[i] = torch.nn.Identity()
    frames = _frames(6)
    codes = [torch.from_numpy(lv)[None] for lv in codec.frames_to_levels(frames)]
    with torch.inference_mode():
        expected = reference.decode(codes)[0, 0].numpy()
    got = codec.decode_windows([CodecWindow(frames)])[0]
    assert got.shape == (6 * 2048,) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert float(np.std(got)) > 1e-3  # random weights still give a real signal


def test_context_frames_is_the_receptive_field(codec: SnacCodec) -> None:
    frames = _frames(10, seed=1)
    assert _window_error(codec, frames, codec.context_frames) < 1e-5
    assert _window_error(codec, frames, codec.context_frames - 1) > 1e-5


def test_position_keyed_noise_makes_windows_agree(noisy: SnacCodec, codec: SnacCodec) -> None:
    frames = _frames(10, seed=2)
    assert _window_error(noisy, frames, noisy.context_frames) < 1e-5
    once = noisy.decode_windows([CodecWindow(frames)])[0]
    np.testing.assert_array_equal(once, noisy.decode_windows([CodecWindow(frames)])[0])
    quiet = codec.decode_windows([CodecWindow(frames)])[0]
    assert np.abs(once - quiet).max() > 1e-3  # the noise is really there
    shifted = noisy.decode_windows([CodecWindow(frames, start=5)])[0]
    assert np.abs(once - shifted).max() > 1e-3  # and keyed by position


def test_batched_windows_of_different_lengths_equal_unbatched(noisy: SnacCodec) -> None:
    frames = _frames(9, seed=3)
    windows = [
        CodecWindow(frames[0:1]),
        CodecWindow(frames[3:9], start=3),
        CodecWindow(frames[5:8], start=5),
    ]
    batched = noisy.decode_windows(windows)
    for window, audio in zip(windows, batched, strict=True):
        alone = noisy.decode_windows([window])[0]
        assert audio.shape == alone.shape == (window.num_frames * 2048,)
        np.testing.assert_allclose(audio, alone, atol=1e-5)


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        (np.full((2, 7), 4096), r"SNAC code 4096 \(frame 0, slot 0\) is outside \[0, 4096\)"),
        (np.array([[0, 1, 2, 3, -1, 5, 6]]), r"slot 4"),
        (np.zeros((2, 6), dtype=np.int64), r"shape \(T >= 1, 7\)"),
        (np.zeros((0, 7), dtype=np.int64), r"shape"),
        (np.zeros((1, 7), dtype=np.float32), r"integers"),
    ],
)
def test_bad_codes_are_a_clear_error(codec: SnacCodec, frames: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        codec.decode_windows([CodecWindow(frames)])


def test_condition_is_refused(codec: SnacCodec) -> None:
    with pytest.raises(ValueError, match="no condition"):
        codec.decode_windows([CodecWindow(_frames(1), condition=np.zeros(32, dtype=np.int64))])


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="missing config.json, pytorch_model.bin"):
        SnacCodec.from_pretrained(tmp_path)


def test_attention_configs_are_refused() -> None:
    config = dict(SNAC_24KHZ_CONFIG, encoder_dim=4, decoder_dim=32, attn_window_size=4)
    with pytest.raises(CheckpointError, match="attention"):
        SnacCodec(snac.SNAC(**config))


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> SnacCodec:
    """SNAC 24 kHz's time structure (strides, kernels, dilations, noise) at 1/16 of the width:
    the same receptive field and stage cuts, decoded fast enough to try every chunk size."""
    config = {**SNAC_24KHZ_CONFIG, "decoder_dim": 64}
    return SnacCodec.from_pretrained(
        write_random_checkpoint(tmp_path_factory.mktemp("snac-narrow"), seed=1, config=config)
    )


def _check_kept(codec: SnacCodec, sizes: tuple[int, ...]) -> None:
    spf, ctx, ahead = codec.samples_per_frame, codec.context_frames, 2
    frames = _frames(ctx + max(sizes) + ahead, seed=4)
    for size in sizes:
        # the stream's first chunk (no left context) and a later one, batched together
        windows = [
            CodecWindow(frames[: left + size + ahead], start=7 * size, keep=(left, left + size))
            for left in (0, ctx)
        ]
        kept = codec.decode_windows(windows)
        for w, part in zip(windows, kept, strict=True):
            a, b = w.keep
            full = codec.decode_windows([replace(w, keep=None)])[0]
            assert part.shape == ((b - a) * spf,)
            np.testing.assert_allclose(part, full[a * spf : b * spf], atol=1e-5)
            np.testing.assert_allclose(codec.decode_windows([w])[0], part, atol=1e-5)


def test_kept_frames_equal_the_whole_window_decode_for_every_chunk_size(narrow: SnacCodec) -> None:
    """Each stage computes only what the kept frames need: the kept audio is the whole-window
    decode's, noise on, for every chunk size the default schedule produces (1, 2, 4, ... 128),
    at the stream's start (left context cut short) and later, batched and alone."""
    assert narrow.context_frames == 3
    _check_kept(narrow, (1, 2, 4, 8, 16, 32, 64, 128))


def test_kept_frames_are_exact_at_full_width(noisy: SnacCodec) -> None:
    """The same on the real width, for the first chunk sizes (the wide decoder is slow)."""
    _check_kept(noisy, (1, 2, 4))


def test_a_stage_cut_too_short_would_change_the_audio(noisy: SnacCodec) -> None:
    """The margins are needed: with each stage's margin one step smaller, kept audio differs
    from the whole-window decode (so the test above can fail)."""
    frames = _frames(12, seed=5)
    window = CodecWindow(frames, keep=(4, 8))
    full = noisy.decode_windows([replace(window, keep=None)])[0][4 * 2048 : 8 * 2048]
    margins = noisy._margins
    try:
        noisy._margins = [max(m - 1, 0) for m in margins]
        short = noisy.decode_windows([window])[0]
    finally:
        noisy._margins = margins
    assert np.abs(short - full).max() > 1e-4
