"""The BiCodec semantic tokenizer (transcript-mode enrolment): parity with Spark-TTS's recipe.

The reference (ReferenceSemanticTokenizer) runs flashtts 0.1.7's ``Encoder`` and
``FactorizedVectorQuantize`` behind the full transformers wav2vec2 model, loading the BiCodec
tensors with torch's own ``load_state_dict``; ours runs our modules, loaded by our loader, behind
a wav2vec2 cut after the last hidden state read. Both read the same files: a tiny BiCodec
checkpoint with random semantic-encoder tensors and a small random wav2vec2 (18 layers, so the
cut drops one). flashtts and espeak-ng are installed by the Makefile / the system.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from speech import espeak

from pipecat_veena.codecs.bicodec.checkpoint import write_random_checkpoint
from pipecat_veena.codecs.bicodec.encoder import volume_normalize
from pipecat_veena.codecs.bicodec.random_semantic import (
    add_random_semantic_encoder,
    write_random_wav2vec2,
)
from pipecat_veena.codecs.bicodec.reference import ReferenceSemanticTokenizer
from pipecat_veena.codecs.bicodec.semantic import SemanticTokenizer
from pipecat_veena.errors import CheckpointError

RATE = 16000
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(BiCodec directory with random semantic-encoder tensors, random wav2vec2 directory)."""
    root = tmp_path_factory.mktemp("semantic")
    bicodec = write_random_checkpoint(root / "BiCodec", "tiny", seed=4)
    add_random_semantic_encoder(bicodec, seed=5)
    return bicodec, write_random_wav2vec2(root / "wav2vec2", hidden_size=64, layers=18, seed=6)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    """Random signals and espeak-ng speech, 1 to about 12 s."""
    rng = np.random.default_rng(11)
    t = np.arange(5 * RATE) / RATE
    random = [
        0.1 * rng.standard_normal(RATE),
        0.02 * rng.standard_normal(int(2.5 * RATE)),  # quiet: raised first
        0.3 * np.sin(2 * np.pi * 220 * t + 4 * np.sin(2 * np.pi * 5 * t)),
        0.8 * np.tanh(3 * rng.standard_normal(12 * RATE)),
    ]
    tmp = tmp_path_factory.mktemp("espeak")
    speech = [espeak(tmp, *spec) for spec in [("en+f3", 160, 70, 1), ("hi", 150, 50, 0)]]
    return [c.astype(np.float32) for c in random] + speech


@pytest.fixture(scope="module")
def pair(parts):
    bicodec, wav2vec2 = parts
    return ReferenceSemanticTokenizer(bicodec, wav2vec2), SemanticTokenizer.from_pretrained(
        bicodec, wav2vec2
    )


def test_matches_the_reference_recipe(pair, clips) -> None:
    reference, ours = pair
    assert len(ours.wav2vec2.model.encoder.layers) == 17  # states 11, 14, 16: one layer cut
    distinct = set()
    for i, wav in enumerate(clips):
        expected = reference.encode(wav)
        features = ours.wav2vec2(volume_normalize(torch.from_numpy(wav)).numpy())[0]
        got = ours.encode(wav)
        seconds = len(wav) / RATE
        assert features.shape == expected["features"].shape
        assert float((features - expected["features"]).abs().max()) <= 1e-4, i
        assert float((got.latents[0] - expected["latents"]).abs().max()) <= 1e-4, i
        assert torch.equal(got.ids[0], expected["ids"]), f"clip {i} ({seconds:.1f} s): ids differ"
        assert abs(got.ids.shape[1] - 50 * seconds) <= 1  # 50 Hz
        assert ours.tokenize(wav) == expected["ids"].tolist()
        distinct.update(got.ids[0].tolist())
    assert len(distinct) > 50  # the ids depend on the clip: equality above compares something


def test_weight_norm_spelling_of_in_project(tmp_path: Path, parts, pair, clips) -> None:
    bicodec, wav2vec2 = parts
    copy = shutil.copytree(bicodec, tmp_path / "BiCodec")
    state = load_file(str(copy / WEIGHTS))
    prefix = "quantizer.in_project."
    state[prefix + "parametrizations.weight.original0"] = state.pop(prefix + "weight_g")
    state[prefix + "parametrizations.weight.original1"] = state.pop(prefix + "weight_v")
    save_file(state, str(copy / WEIGHTS))
    respelled = SemanticTokenizer.from_pretrained(copy, wav2vec2)
    _, ours = pair
    assert respelled.tokenize(clips[4]) == ours.tokenize(clips[4])


def test_checkpoint_without_the_semantic_encoder_is_a_clear_error(tmp_path: Path) -> None:
    bicodec = write_random_checkpoint(tmp_path / "BiCodec", "tiny", seed=1)  # demo layout
    with pytest.raises(CheckpointError, match=r"no semantic-encoder tensors .* without a transc"):
        SemanticTokenizer.from_pretrained(bicodec, tmp_path / "unused")


def test_wav2vec2_of_another_width_is_a_clear_error(tmp_path: Path, parts) -> None:
    bicodec, _ = parts
    wav2vec2 = write_random_wav2vec2(tmp_path / "w2v", hidden_size=32, layers=16)
    with pytest.raises(CheckpointError, match="hidden size 32 != .* input_channels 64"):
        SemanticTokenizer.from_pretrained(bicodec, wav2vec2)
    with pytest.raises(CheckpointError, match="cannot load the wav2vec2 model"):
        SemanticTokenizer.from_pretrained(bicodec, tmp_path / "missing")
