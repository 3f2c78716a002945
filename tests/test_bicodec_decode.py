"""BiCodec decoding: config numbers, receptive field (autograd), exact windows, batching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipecat_veena.codecs.base import CodecWindow
from pipecat_veena.codecs.bicodec import (
    BiCodecCodec,
    BiCodecConfig,
    BiCodecDecoder,
    write_random_checkpoint,
)
from pipecat_veena.codecs.bicodec.checkpoint import REAL_CONFIG, TINY_CONFIG


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "BiCodec", "tiny", seed=7)


@pytest.fixture(scope="module")
def codec(tiny_dir: Path) -> BiCodecCodec:
    return BiCodecCodec.from_pretrained(tiny_dir.parent)


def _stream(steps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 8192, (steps, 1)), rng.integers(0, 4096, 32)


def _measured_receptive_field(decoder: BiCodecDecoder, steps: int, token: int) -> tuple[int, int]:
    """Tokens whose features get a non-zero gradient from the samples of ``token``."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8192, (1, steps), generator=gen)
    globals_ = torch.randint(0, 4096, (1, 32), generator=gen)
    with torch.no_grad():
        features, speaker = decoder.quantizer(ids), decoder.speaker_encoder(globals_)
    features.requires_grad_(True)
    hop = decoder.hop_length
    decoder(features, speaker)[0, token * hop : (token + 1) * hop].sum().backward()
    touched = torch.nonzero(features.grad[0].abs().sum(-1)).flatten()
    return token - int(touched.min()), int(touched.max()) - token


def test_numbers_come_from_the_config(codec: BiCodecCodec) -> None:
    real = BiCodecConfig.from_dict(REAL_CONFIG)
    assert (real.sample_rate, real.hop_length, real.receptive_field) == (16000, 320, 67)
    decoder = codec.decoder
    assert (decoder.sample_rate, decoder.hop_length) == (16000, 320)
    assert codec.samples_per_frame == decoder.hop_length
    assert (codec.codes_per_frame, codec.condition_size) == (1, 32)
    assert codec.context_frames == BiCodecConfig.from_dict(TINY_CONFIG).receptive_field
    assert codec.frame_rate == 50.0


def test_receptive_field_matches_autograd_tiny(codec: BiCodecCodec) -> None:
    rf = codec.context_frames
    left, right = _measured_receptive_field(codec.decoder, steps=2 * rf + 31, token=rf + 15)
    assert left == right == rf


@pytest.mark.slow
def test_receptive_field_matches_autograd_real(tmp_path: Path) -> None:
    decoder = BiCodecDecoder.from_pretrained(write_random_checkpoint(tmp_path, "real"))
    rf = decoder.receptive_field
    left, right = _measured_receptive_field(decoder, steps=2 * rf + 3, token=rf + 1)
    assert left == right == rf == 67


def test_window_with_full_context_equals_full_decode(codec: BiCodecCodec) -> None:
    frames, globals_ = _stream(300, seed=1)
    hop, ctx = codec.samples_per_frame, codec.context_frames
    full = codec.decode_windows([CodecWindow(frames, globals_)])[0]
    emits = [(0, 20), (20, 70), (140, 190), (250, 300)]  # stream edges included
    windows, spans = [], []
    for start, end in emits:
        lo, hi = max(0, start - ctx), min(300, end + ctx)
        windows.append(CodecWindow(frames[lo:hi], globals_, start=lo))
        spans.append((start - lo, end - lo))
    decoded = codec.decode_windows(windows)  # one batch, different lengths
    for (start, end), (a, b), wav in zip(emits, spans, decoded, strict=True):
        err = np.abs(wav[a * hop : b * hop] - full[start * hop : end * hop]).max()
        assert err <= 1e-5, (start, end, err)


def test_short_right_context_is_not_exact(codec: BiCodecCodec) -> None:
    """The exactness above is not vacuous: without lookahead the seam differs."""
    frames, globals_ = _stream(200, seed=2)
    hop = codec.samples_per_frame
    full = codec.decode_windows([CodecWindow(frames, globals_)])[0]
    cut = codec.decode_windows([CodecWindow(frames[:100], globals_)])[0]
    assert np.abs(cut[90 * hop :] - full[90 * hop : 100 * hop]).max() > 1e-3


def test_batched_equals_unbatched(codec: BiCodecCodec) -> None:
    windows = [CodecWindow(*_stream(n, seed=n)) for n in (37, 120, 1, 64, 119)]
    batched = codec.decode_windows(windows)
    for window, wav in zip(windows, batched, strict=True):
        alone = codec.decode_windows([window])[0]
        assert wav.dtype == np.float32 and wav.shape == (window.num_frames * 320,)
        assert np.abs(wav - alone).max() <= 1e-5
        assert np.abs(wav).max() <= 1.0


def test_padding_is_zero_and_never_leaks(codec: BiCodecCodec) -> None:
    decoder = codec.decoder
    gen = torch.Generator().manual_seed(3)
    semantic = torch.randint(0, 8192, (3, 80), generator=gen)
    globals_ = torch.randint(0, 4096, (3, 32), generator=gen)
    lengths = torch.tensor([80, 33, 0])
    wav = decoder.decode(semantic, globals_, lengths)
    assert wav.shape == (3, 80 * 320) and wav.dtype == torch.float32
    assert torch.all(wav[1, 33 * 320 :] == 0) and torch.all(wav[2] == 0)
    other_padding = semantic.clone()
    other_padding[1, 33:] = torch.randint(0, 8192, (47,), generator=gen)
    again = decoder.decode(other_padding, globals_, lengths)
    assert torch.equal(again[1], wav[1])  # padding content cannot change real samples
    alone = decoder.decode(semantic[1:2, :33], globals_[1:2])
    assert float((wav[1, : 33 * 320] - alone[0]).abs().max()) <= 1e-5


def test_edge_cases(codec: BiCodecCodec) -> None:
    assert codec.decode_windows([]) == []
    empty = codec.decode_windows([CodecWindow(np.zeros((0, 1), np.int64), np.zeros(32, np.int64))])
    assert empty[0].shape == (0,) and empty[0].dtype == np.float32


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (CodecWindow(np.zeros(5, np.int64), np.zeros(32, np.int64)), r"shape \(T, 1\)"),
        (CodecWindow(np.zeros((5, 2), np.int64), np.zeros(32, np.int64)), r"shape \(T, 1\)"),
        (CodecWindow(np.zeros((5, 1), np.int64), None), "32 global ids"),
        (CodecWindow(np.zeros((5, 1), np.int64), np.zeros(31, np.int64)), "32 global ids"),
        (CodecWindow(np.full((5, 1), 8192), np.zeros(32, np.int64)), r"semantic_ids .*8192"),
        (CodecWindow(np.zeros((5, 1), np.int64), np.full(32, -1)), r"global_ids .*4096"),
        (CodecWindow(np.zeros((5, 1)), np.zeros(32, np.int64)), "integer"),
    ],
)
def test_bad_windows_are_named(codec: BiCodecCodec, window: CodecWindow, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        codec.decode_windows([CodecWindow(*_stream(4, seed=0)), window])


def test_bad_lengths(codec: BiCodecCodec) -> None:
    ids, globals_ = torch.zeros(2, 10, dtype=torch.long), torch.zeros(2, 32, dtype=torch.long)
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 11\)"):
        codec.decoder.decode(ids, globals_, torch.tensor([3, 11]))
    with pytest.raises(ValueError, match=r"lengths must have shape \(2,\)"):
        codec.decoder.decode(ids, globals_, torch.tensor([3]))


def test_bf16_decode_runs_and_stays_close(tiny_dir: Path, codec: BiCodecCodec) -> None:
    half = BiCodecCodec.from_pretrained(tiny_dir, dtype=torch.bfloat16)
    assert codec.decoder.dtype == torch.float32 and half.decoder.dtype == torch.bfloat16
    window = CodecWindow(*_stream(60, seed=4))
    exact, approx = codec.decode_windows([window])[0], half.decode_windows([window])[0]
    assert approx.dtype == np.float32
    snr = 10 * np.log10(np.mean(exact**2) / np.mean((exact - approx) ** 2))
    assert snr > 15, snr
