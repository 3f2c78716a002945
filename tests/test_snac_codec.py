"""SnacCodec on a random SNAC 24 kHz checkpoint: layout, receptive field, noise, batching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import snac
import torch

from pipecat_veena.codecs.base import CodecWindow  # noqa: E402
from pipecat_veena.codecs.snac import SNAC_24KHZ_CONFIG, SnacCodec  # noqa: E402
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
