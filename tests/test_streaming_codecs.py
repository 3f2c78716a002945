"""StreamDecoder through the real codecs (random weights): streamed audio vs one offline decode.

SNAC: the random 24 kHz checkpoint (position-keyed noise on and off); BiCodec: the tiny config.
Exact (<= 1e-5) when both contexts reach the receptive field; the default configs' SNR is checked
against a floor set with margin below what benchmarks/streaming.py measures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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


# Measured on 100-token random streams (4 seeds): 50.1-53.2 dB at the BiCodec defaults on the
# tiny config's random weights (the real config's figures are in BENCHMARKS.md).
BICODEC_TINY_DEFAULT_SNR_FLOOR_DB = 42.0


@pytest.fixture(scope="module")
def bicodec_tiny(tmp_path_factory: pytest.TempPathFactory):
    from pipecat_veena.codecs.bicodec import BiCodecCodec, write_random_checkpoint

    directory = write_random_checkpoint(tmp_path_factory.mktemp("bicodec_tiny"), "tiny", seed=0)
    return BiCodecCodec.from_pretrained(directory)


def _bicodec_tokens(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 8192, size=(n, 1)), rng.integers(0, 4096, size=32)


def test_bicodec_stream_is_exact_with_full_context(bicodec_tiny) -> None:
    frames, globals_ = _bicodec_tokens(0, 90)
    ctx = bicodec_tiny.context_frames
    config = StreamConfig(first_frames=3, lookahead_frames=ctx, max_chunk_frames=16)
    streamed = _stream(bicodec_tiny, frames, config, condition=globals_)
    np.testing.assert_allclose(streamed, _offline(bicodec_tiny, frames, globals_), atol=1e-5)


def test_bicodec_default_stream_first_audio_and_snr(bicodec_tiny) -> None:
    frames, globals_ = _bicodec_tokens(1, 100)
    config = StreamConfig.for_codec(bicodec_tiny)
    assert config.first_frames + config.lookahead_frames <= 20
    assert config.left_context(bicodec_tiny) == bicodec_tiny.context_frames
    decoder = StreamDecoder(bicodec_tiny, condition=tuple(globals_.tolist()))
    chunks = [decoder.push([int(code)]) for code in frames[:, 0]]
    first = next(i for i, new in enumerate(chunks, start=1) if new)
    assert first == config.first_frames + config.lookahead_frames
    streamed = np.concatenate([c for new in chunks for c in new] + decoder.finish())
    assert streamed.shape == (100 * 320,)
    snr = snr_db(_offline(bicodec_tiny, frames, globals_), streamed)
    assert snr >= BICODEC_TINY_DEFAULT_SNR_FLOOR_DB


def test_bicodec_stream_needs_its_globals(bicodec_tiny) -> None:
    with pytest.raises(ValueError, match="32 ids"):
        StreamDecoder(bicodec_tiny)
