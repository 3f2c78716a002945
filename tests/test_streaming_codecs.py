"""StreamDecoder through the real codecs (random weights): streamed audio vs one offline decode.

SNAC: the random 24 kHz checkpoint (position-keyed noise on and off); BiCodec: the tiny config.
Exact (<= 1e-5) when both contexts reach the receptive field; the default configs' SNR is checked
against a floor set with margin below what benchmarks/streaming.py measures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from pipecat_veena.audio import snr_db  # noqa: E402
from pipecat_veena.codecs.base import AudioCodec, CodecWindow  # noqa: E402
from pipecat_veena.codecs.snac import SnacCodec  # noqa: E402
from pipecat_veena.streaming import StreamConfig, StreamDecoder  # noqa: E402

# Measured on 120-frame random streams (3 seeds): 97.6-98.0 dB at the SNAC defaults.
SNAC_DEFAULT_SNR_FLOOR_DB = 85.0


@pytest.fixture(scope="module")
def snac_noisy(snac_random_dir: Path) -> SnacCodec:
    return SnacCodec.from_pretrained(snac_random_dir)


@pytest.fixture(scope="module")
def snac_quiet(snac_random_dir: Path) -> SnacCodec:
    return SnacCodec.from_pretrained(snac_random_dir, noise=False)


def _stream(codec: AudioCodec, codes: np.ndarray, config: StreamConfig | None, **kw) -> np.ndarray:
    """Push ``codes`` one at a time (as an LLM emits them), then finish; concatenate the chunks."""
    decoder = StreamDecoder(codec, config, **kw)
    chunks = [chunk for code in codes.reshape(-1).tolist() for chunk in decoder.push([code])]
    chunks += decoder.finish()
    assert decoder.frames_emitted == len(codes)
    return np.concatenate(chunks)


def _offline(codec: AudioCodec, frames: np.ndarray, condition: np.ndarray | None = None):
    return codec.decode_windows([CodecWindow(frames=frames, condition=condition)])[0]


def test_snac_stream_is_exact_with_full_context_and_noise_on(snac_noisy: SnacCodec) -> None:
    frames = np.random.default_rng(0).integers(0, 4096, size=(12, 7))
    ctx = snac_noisy.context_frames
    config = StreamConfig(first_frames=1, lookahead_frames=ctx, max_chunk_frames=4)
    streamed = _stream(snac_noisy, frames, config)
    np.testing.assert_allclose(streamed, _offline(snac_noisy, frames), atol=1e-5)


def test_snac_default_stream_snr_and_first_audio(snac_quiet: SnacCodec) -> None:
    frames = np.random.default_rng(1).integers(0, 4096, size=(16, 7))
    config = StreamConfig.for_codec(snac_quiet)
    decoder = StreamDecoder(snac_quiet)
    first_audio_at, chunks = None, []
    for i, code in enumerate(frames.reshape(-1).tolist(), start=1):
        new = decoder.push([code])
        if new and first_audio_at is None:
            first_audio_at = i
        chunks += new
    chunks += decoder.finish()
    assert first_audio_at == 7 * (config.first_frames + config.lookahead_frames) <= 21
    streamed = np.concatenate(chunks)
    assert snr_db(_offline(snac_quiet, frames), streamed) >= SNAC_DEFAULT_SNR_FLOOR_DB


@pytest.mark.parametrize("n_tokens", [7, 14, 21])
def test_snac_stream_shorter_than_28_tokens_yields_all_its_audio(
    snac_noisy: SnacCodec, n_tokens: int
) -> None:
    frames = np.random.default_rng(n_tokens).integers(0, 4096, size=(n_tokens // 7, 7))
    streamed = _stream(snac_noisy, frames, None)
    assert streamed.shape == (len(frames) * snac_noisy.samples_per_frame,)
    assert float(np.abs(streamed).max()) > 0.0
    np.testing.assert_allclose(streamed, _offline(snac_noisy, frames), atol=1e-5)


def test_snac_code_out_of_range_is_a_clear_error(snac_quiet: SnacCodec) -> None:
    decoder = StreamDecoder(snac_quiet)
    with pytest.raises(ValueError, match=r"SNAC code 5000 \(frame 0, slot 3\)"):
        decoder.push([1, 2, 3, 5000, 5, 6, 7] * 3)
