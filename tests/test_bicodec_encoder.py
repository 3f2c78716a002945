"""The BiCodec speaker encoder: parity with flashtts 0.1.7's SpeakerEncoder, loading, errors.

The reference (ReferenceSpeakerEncoder) runs flashtts's modules behind numpy versions of the
Spark-TTS recipe (volume normalisation, 6 s clip, torchaudio-style mel); it is built with random
weights, its state dict is saved in the official layout (x-vector head and BatchNorm counters
included) and loaded with our loader. Clips: random signals and espeak-ng speech, 1-30 s.
flashtts and espeak-ng are installed by the Makefile / the system: missing, these tests fail.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from speech import espeak

from pipecat_veena.codecs.bicodec.checkpoint import REAL_CONFIG, TINY_CONFIG
from pipecat_veena.codecs.bicodec.encoder import BiCodecSpeakerEncoder, volume_normalize
from pipecat_veena.codecs.bicodec.reference import (
    ReferenceSpeakerEncoder,
    reference_volume_normalize,
)
from pipecat_veena.errors import CheckpointError

RATE = 16000
WEIGHTS = "model.safetensors"
#: (espeak-ng voice, words per minute, pitch 0-99, repeats of the sentence): 1 to 30 seconds.
ESPEAK_CLIPS = [
    ("en", 175, 50, 0),
    ("en+f3", 160, 70, 1),
    ("en+m3", 140, 30, 2),
    ("en-us+f2", 200, 60, 3),
    ("de", 150, 40, 1),
    ("fr+f4", 170, 80, 2),
    ("es+m1", 180, 20, 1),
    ("hi", 150, 50, 2),
    ("it+f1", 130, 65, 4),
    ("en+whisper", 160, 50, 1),
    ("nl+m7", 190, 35, 3),
    ("pt+f5", 120, 55, 5),
]


def random_clips(seed: int) -> list[np.ndarray]:
    """Ten random signals of 1-30 s: noises at several levels (one under the quiet threshold,
    one almost silent), tones with vibrato, clicks."""
    rng = np.random.default_rng(seed)
    t = lambda s: np.arange(int(s * RATE)) / RATE  # noqa: E731
    clips = [
        0.1 * rng.standard_normal(RATE),  # 1 s: tiled six times
        0.02 * rng.standard_normal(int(2.5 * RATE)),  # quiet: raised to a 0.1 peak first
        0.8 * np.tanh(3 * rng.standard_normal(30 * RATE)),  # 30 s, loud
        np.cumsum(rng.standard_normal(4 * RATE)) * 1e-3,  # brown noise
        0.3 * np.sin(2 * np.pi * 220 * t(5) + 4 * np.sin(2 * np.pi * 5 * t(5))),
        0.2 * np.sin(2 * np.pi * np.cumsum(200 + 600 * t(8)) / RATE),  # chirp
        (rng.random(7 * RATE) < 0.002) * 0.9,  # clicks
        0.005 * rng.standard_normal(3 * RATE),  # nearly silent
        0.25 * rng.standard_normal(11 * RATE) * np.sin(2 * np.pi * 3 * t(11)) ** 2,
        0.4 * np.sign(np.sin(2 * np.pi * 120 * t(1.7))) + 0.05 * rng.standard_normal(27200),
    ]
    return [c.astype(np.float32) for c in clips]


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    tmp = tmp_path_factory.mktemp("espeak")
    return random_clips(seed=3) + [espeak(tmp, *spec) for spec in ESPEAK_CLIPS]


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory):
    """(reference, our encoder loaded from the reference's saved state dict), tiny config."""
    root = tmp_path_factory.mktemp("tiny-encoder")
    torch.manual_seed(0)
    reference = ReferenceSpeakerEncoder(TINY_CONFIG).randomize(seed=1).eval()
    reference.save(root / "BiCodec", TINY_CONFIG)
    return reference, BiCodecSpeakerEncoder.from_pretrained(root), root / "BiCodec"


def _compare(reference: ReferenceSpeakerEncoder, ours: BiCodecSpeakerEncoder, wav: np.ndarray):
    expected = reference.encode(wav)
    with torch.inference_mode():
        got = ours(ours.prepare(wav)[None])
    errors = {
        stage: float((getattr(got, stage)[0] - expected[stage]).abs().max())
        for stage in ("mel", "latent", "tokens")
    }
    return expected["ids"].long(), got.ids[0], errors


def test_matches_flashtts_on_random_and_speech_clips(tiny_pair, clips) -> None:
    reference, ours, _ = tiny_pair
    assert len(clips) >= 20
    durations = [len(c) / RATE for c in clips]
    assert min(durations) <= 1.0 and max(durations) >= 29.0, durations
    id_sets, worst = set(), dict.fromkeys(("mel", "latent", "tokens"), 0.0)
    for i, wav in enumerate(clips):
        expected, got, errors = _compare(reference, ours, wav)
        worst = {stage: max(worst[stage], errors[stage]) for stage in worst}
        assert torch.equal(got, expected), f"clip {i} ({durations[i]:.1f} s): ids differ"
        assert max(errors.values()) <= 1e-4, f"clip {i}: {errors}"
        assert got.shape == (32,) and 0 <= int(got.min()) and int(got.max()) < 4096
        id_sets.add(tuple(got.tolist()))
    print(f"{len(clips)} clips, {len(id_sets)} distinct voices, worst abs errors {worst}")
    # the ids depend on the clip, so equality above compares something
    assert len(id_sets) >= len(clips) // 2, f"only {len(id_sets)} distinct voices"


def test_matches_flashtts_with_the_official_sizes(tmp_path: Path, clips) -> None:
    torch.manual_seed(0)
    reference = ReferenceSpeakerEncoder(REAL_CONFIG).randomize(seed=2).eval()
    reference.save(tmp_path / "BiCodec", REAL_CONFIG)
    ours = BiCodecSpeakerEncoder.from_pretrained(tmp_path)
    assert ours.clip_samples == 96000
    for wav in (clips[0], clips[-1], clips[12]):
        expected, got, errors = _compare(reference, ours, wav)
        assert torch.equal(got, expected)
        assert max(errors.values()) <= 1e-4, errors


def test_volume_normalize_follows_the_recipe() -> None:
    rng = np.random.default_rng(5)
    cases = {
        "loud": 0.9 * rng.standard_normal(16000).clip(-1.1, 1.1),
        "quiet": 0.03 * rng.standard_normal(16000),
        "few loud samples": np.r_[np.zeros(1000), 0.5 * np.ones(5)],
        "silence": np.zeros(800),
    }
    for name, wav in cases.items():
        got = volume_normalize(torch.from_numpy(wav).float()).numpy()
        expected = reference_volume_normalize(wav.astype(np.float32).astype(np.float64))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)


def _respell(directory: Path, spelling: str) -> None:
    """Rewrite every conv / linear weight of the speaker encoder in another weight spelling."""
    state = load_file(str(directory / WEIGHTS))
    out = {}
    for key, value in state.items():
        is_weight = key.endswith(".weight") and value.dim() >= 2
        if not (key.startswith("speaker_encoder.") and is_weight) or "latents" in key:
            out[key] = value
            continue
        prefix = key[: -len("weight")]
        dims = tuple(range(1, value.dim()))
        g = torch.linalg.vector_norm(value, dim=dims, keepdim=True) * 2.0
        v = value * 2.0  # any direction scale: only v / ||v|| counts
        if spelling == "legacy":
            out[prefix + "weight_g"], out[prefix + "weight_v"] = g / 2.0, v
        else:
            out[prefix + "parametrizations.weight.original0"] = g / 2.0
            out[prefix + "parametrizations.weight.original1"] = v
    save_file(out, str(directory / WEIGHTS))


@pytest.mark.parametrize("spelling", ["legacy", "parametrizations"])
def test_weight_norm_spellings_encode_the_same(tmp_path: Path, tiny_pair, clips, spelling) -> None:
    reference, ours, saved = tiny_pair
    copy = tmp_path / "BiCodec"
    shutil.copytree(saved, copy)
    _respell(copy, spelling)
    keys = set(load_file(str(copy / WEIGHTS)))
    assert "speaker_encoder.speaker_encoder.layer1.conv.weight" not in keys
    respelled = BiCodecSpeakerEncoder.from_pretrained(copy)
    for wav in clips[10:13]:
        clip = ours.prepare(wav)[None]
        with torch.inference_mode():
            a, b = ours(clip), respelled(clip)
        assert torch.equal(a.ids, b.ids)
        assert float((a.tokens - b.tokens).abs().max()) <= 1e-5


def test_checkpoint_without_speaker_encoder_is_a_clear_error(tmp_path: Path, tiny_pair) -> None:
    _, _, saved = tiny_pair
    copy = tmp_path / "BiCodec"
    shutil.copytree(saved, copy)
    state = load_file(str(copy / WEIGHTS))
    kept = {k: v for k, v in state.items() if not k.startswith("speaker_encoder.speaker_encoder.")}
    save_file(kept, str(copy / WEIGHTS))
    with pytest.raises(CheckpointError, match="no speaker-encoder tensors"):
        BiCodecSpeakerEncoder.from_pretrained(tmp_path)


def test_missing_perceiver_tensor_names_the_key(tmp_path: Path, tiny_pair) -> None:
    _, _, saved = tiny_pair
    copy = tmp_path / "BiCodec"
    shutil.copytree(saved, copy)
    state = load_file(str(copy / WEIGHTS))
    state.pop("speaker_encoder.perceiver_sampler.layers.1.0.to_kv.weight")
    save_file(state, str(copy / WEIGHTS))
    with pytest.raises(CheckpointError, match=r"missing speaker-encoder tensor .*to_kv"):
        BiCodecSpeakerEncoder.from_pretrained(copy)


@pytest.mark.parametrize(
    ("wav", "problem"),
    [
        (np.zeros(0), "non-empty 1-D"),
        (np.zeros((2, 100)), "non-empty 1-D"),
        (np.array([0.1, np.nan] * 100), "NaN or infinite"),
    ],
)
def test_bad_clip_is_a_clear_error(tiny_pair, wav: np.ndarray, problem: str) -> None:
    _, ours, _ = tiny_pair
    with pytest.raises(ValueError, match=problem):
        ours.tokenize(wav)
