"""The CPU codec dtype probe: bfloat16 only where it is native, clearly faster and close to float32;
an explicit ``codec_dtype`` wins; the real demo codecs go through it at engine start."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from engine_fakes import FakeBiCodec

from pipecat_veena.codecs import probe
from pipecat_veena.engine import EngineConfig, detect_layout, load_codec


class _TimedCodec(FakeBiCodec):
    """FakeBiCodec that takes ``delay_s`` per decode and adds ``noise`` to its audio."""

    def __init__(self, dtype: torch.dtype, delay_s: float, noise: float = 0.0) -> None:
        super().__init__()
        self.dtype, self.delay_s, self.noise = dtype, delay_s, noise

    def decode_windows(self, windows):
        time.sleep(self.delay_s)
        out = super().decode_windows(windows)
        return [a + self.noise * np.sign(np.sin(np.arange(a.size))) for a in out]


def _loader(bf16_delay_s: float, bf16_noise: float = 0.0):
    loaded: list[torch.dtype] = []

    def load(dtype: torch.dtype) -> _TimedCodec:
        loaded.append(dtype)
        if dtype == torch.float32:
            return _TimedCodec(dtype, 0.04)
        return _TimedCodec(dtype, bf16_delay_s, bf16_noise)

    return load, loaded


@pytest.fixture
def native(monkeypatch):
    monkeypatch.setattr(probe, "native_bfloat16", lambda: True)


def test_without_native_bfloat16_float32_and_no_second_load(monkeypatch):
    monkeypatch.setattr(probe, "native_bfloat16", lambda: False)
    load, loaded = _loader(0.0)
    codec, choice = probe.choose_cpu_dtype(load)
    assert codec.dtype == choice.dtype == torch.float32 and loaded == [torch.float32]
    assert "no native bfloat16" in choice.reason


def test_bfloat16_when_clearly_faster_and_close(native):
    codec, choice = probe.choose_cpu_dtype(_loader(0.0)[0])  # 40 ms against ~0 ms
    assert codec.dtype == choice.dtype == torch.bfloat16
    assert choice.float32_ms > choice.bfloat16_ms and choice.snr_db > probe.MIN_SNR_DB


def test_float32_when_bfloat16_is_not_faster(native):
    codec, choice = probe.choose_cpu_dtype(_loader(0.08)[0])  # 40 ms against 80 ms
    assert codec.dtype == choice.dtype == torch.float32 and "faster" in choice.reason


def test_float32_when_bfloat16_audio_is_far_off(native):
    codec, choice = probe.choose_cpu_dtype(_loader(0.0, bf16_noise=0.5)[0])
    assert codec.dtype == torch.float32 and choice.snr_db < probe.MIN_SNR_DB
    assert "too far" in choice.reason


def test_probe_window_fits_the_codec():
    window = probe.probe_window(FakeBiCodec())
    assert window.frames.shape == (50, 1) and window.condition.shape == (32,)


@pytest.mark.parametrize("kind", ["spark", "veena"])
def test_real_codecs_are_probed_at_load_and_an_explicit_dtype_wins(
    kind, spark_checkpoint, veena_checkpoint
):
    from loguru import logger

    path = spark_checkpoint if kind == "spark" else veena_checkpoint
    layout = detect_layout(path)
    lines: list[str] = []
    handler = logger.add(lines.append, level="INFO", format="{message}")
    try:
        auto = load_codec(layout, EngineConfig(checkpoint=path, device="cpu"))
        chosen = [line for line in lines if line.startswith("codec dtype")]
        assert auto.dtype in (torch.float32, torch.bfloat16)
        if probe.native_bfloat16():
            assert len(chosen) == 1 and "float32" in chosen[0] and "ms" in chosen[0]
        lines.clear()
        pinned = load_codec(layout, EngineConfig(checkpoint=path, codec_dtype="float32"))
        assert pinned.dtype == torch.float32
        assert not [line for line in lines if line.startswith("codec dtype")]
    finally:
        logger.remove(handler)
    window = probe.probe_window(auto)
    audio = auto.decode_windows([window])[0]
    assert audio.shape == (window.num_frames * auto.samples_per_frame,)
    assert np.isfinite(audio).all()


def test_cli_codec_dtype_flag():
    from pipecat_veena.cli import _codec_dtype, build_parser

    parser = build_parser()
    args = parser.parse_args(["say", "hi", "--codec-dtype", "bfloat16"])
    assert _codec_dtype(args) == "bfloat16"
    assert _codec_dtype(parser.parse_args(["serve"])) is None
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--codec-dtype", "int8"])
