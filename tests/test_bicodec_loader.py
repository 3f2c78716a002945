"""BiCodec checkpoint loading: weight-norm spellings, fold per channel, every error, the writer."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from torch import nn

from pipecat_veena.codecs.bicodec import BiCodecDecoder, write_random_checkpoint
from pipecat_veena.codecs.bicodec.checkpoint import REAL_CONFIG
from pipecat_veena.codecs.bicodec.loader import fold_weight_norm
from pipecat_veena.errors import CheckpointError

WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny") / "BiCodec", "tiny", seed=3)


@pytest.fixture
def copy_dir(tiny_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_dir, tmp_path / "BiCodec"))


def _tokens(batch: int = 2, steps: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return torch.randint(0, 8192, (batch, steps), generator=gen), torch.randint(
        0, 4096, (batch, 32), generator=gen
    )


def _rewrite(directory: Path, edit) -> None:
    tensors = load_file(str(directory / WEIGHTS))
    save_file(edit(tensors), str(directory / WEIGHTS))


def _edit_config(directory: Path, edit) -> None:
    data = yaml.safe_load((directory / CONFIG).read_text())
    edit(data)
    (directory / CONFIG).write_text(yaml.safe_dump(data))


# --- weight norm ---


def test_fold_transposed_conv_is_per_input_channel() -> None:
    """torch's own weight norm on a ConvTranspose1d (dim 0 = input channels) is the reference."""
    conv = nn.utils.parametrizations.weight_norm(nn.ConvTranspose1d(6, 4, 5, stride=2))
    with torch.no_grad():
        conv.parametrizations.weight.original0.mul_(torch.rand(6, 1, 1) + 0.5)
    g = conv.parametrizations.weight.original0.detach()
    v = conv.parametrizations.weight.original1.detach()
    assert g.shape == (6, 1, 1)
    torch.testing.assert_close(fold_weight_norm(g, v), conv.weight.detach(), rtol=0, atol=1e-7)
    wrong = v * (g / v.norm(dim=(0, 2), keepdim=True))  # norm per output channel: wrong axis
    assert not torch.allclose(wrong, conv.weight.detach(), atol=1e-3)


def test_fold_conv_is_per_output_channel() -> None:
    conv = nn.utils.weight_norm(nn.Conv1d(5, 3, 7))  # legacy API: weight_g / weight_v
    with torch.no_grad():
        conv.weight_g.mul_(torch.rand(3, 1, 1) + 0.5)
        conv(torch.zeros(1, 5, 7))  # recomputes conv.weight from g and v
    folded = fold_weight_norm(conv.weight_g.detach(), conv.weight_v.detach())
    torch.testing.assert_close(folded, conv.weight.detach(), rtol=0, atol=1e-7)


def _to_parametrizations(tensors: dict) -> dict:
    names = {
        "weight_g": "parametrizations.weight.original0",
        "weight_v": "parametrizations.weight.original1",
    }
    out = {}
    for key, value in tensors.items():
        prefix, _, leaf = key.rpartition(".")
        out[f"{prefix}.{names[leaf]}" if leaf in names else key] = value
    return out


def _to_plain(tensors: dict) -> dict:
    """Fold with torch's kernel (torch._weight_norm, dim 0), independent of our fold."""
    out = {k: v for k, v in tensors.items() if not k.endswith(("weight_g", "weight_v"))}
    for key in tensors:
        if key.endswith("weight_g") and not key.startswith("quantizer.in_project"):
            prefix = key[: -len("weight_g")]
            out[prefix + "weight"] = torch._weight_norm(
                tensors[prefix + "weight_v"], tensors[key], 0
            )
    return out


@pytest.mark.parametrize("spelling", ["parametrizations", "plain"])
def test_weight_norm_spellings_decode_the_same(copy_dir: Path, tiny_dir: Path, spelling) -> None:
    _rewrite(copy_dir, _to_parametrizations if spelling == "parametrizations" else _to_plain)
    keys = set(load_file(str(copy_dir / WEIGHTS)))
    assert not any(k.startswith("decoder.") and k.endswith("weight_g") for k in keys)
    semantic, globals_ = _tokens()
    legacy = BiCodecDecoder.from_pretrained(tiny_dir).decode(semantic, globals_)
    other = BiCodecDecoder.from_pretrained(copy_dir).decode(semantic, globals_)
    assert float((legacy - other).abs().max()) <= 1e-5


# --- errors ---


@pytest.mark.parametrize(
    "key", ["decoder.model.6.weight_v", "decoder.model.2.block.1.weight_g", "prenet.linear.bias"]
)
def test_missing_decode_key(copy_dir: Path, key: str) -> None:
    _rewrite(copy_dir, lambda t: {k: v for k, v in t.items() if k != key})
    with pytest.raises(CheckpointError, match=f"{WEIGHTS}: missing decode tensor") as err:
        BiCodecDecoder.from_pretrained(copy_dir)
    stem = key.rsplit(".", 1)[0]
    assert stem in str(err.value) and "config.yaml" in str(err.value)


def test_shape_mismatch_names_key_expected_and_found(copy_dir: Path) -> None:
    _rewrite(copy_dir, lambda t: {**t, "prenet.linear_pre.weight": torch.zeros(32, 65)})
    with pytest.raises(CheckpointError) as err:
        BiCodecDecoder.from_pretrained(copy_dir)
    msg = str(err.value)
    assert "'prenet.linear_pre.weight'" in msg and str(copy_dir / WEIGHTS) in msg
    assert "(32, 65)" in msg and "expected (32, 64)" in msg


def test_weight_norm_magnitude_with_wrong_shape(copy_dir: Path) -> None:
    key = "decoder.model.0.weight_g"
    _rewrite(copy_dir, lambda t: {**t, key: torch.ones(32, 2, 1)})
    with pytest.raises(
        CheckpointError, match=rf"'{key}' has shape \(32, 2, 1\), expected \(32, 1, 1\)"
    ):
        BiCodecDecoder.from_pretrained(copy_dir)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_unreadable_weights_file(copy_dir: Path, damage: str) -> None:
    path = copy_dir / WEIGHTS
    data = path.read_bytes()
    path.write_bytes(
        {
            "garbage": b"not a safetensors file" * 10,
            "truncated": data[: len(data) // 2],
            "empty": b"",
        }[damage]
    )
    with pytest.raises(CheckpointError, match="cannot read the safetensors file") as err:
        BiCodecDecoder.from_pretrained(copy_dir)
    assert str(path) in str(err.value)


def test_config_without_audio_tokenizer_block(copy_dir: Path) -> None:
    data = yaml.safe_load((copy_dir / CONFIG).read_text())
    (copy_dir / CONFIG).write_text(yaml.safe_dump({"tokenizer": data["audio_tokenizer"]}))
    with pytest.raises(CheckpointError, match="no 'audio_tokenizer' block") as err:
        BiCodecDecoder.from_pretrained(copy_dir)
    assert str(copy_dir / CONFIG) in str(err.value)


@pytest.mark.parametrize(
    "block", ["decoder", "prenet", "speaker_encoder", "quantizer", "mel_params"]
)
def test_config_without_needed_sub_block(copy_dir: Path, block: str) -> None:
    _edit_config(copy_dir, lambda d: d["audio_tokenizer"].pop(block))
    with pytest.raises(CheckpointError, match=f"no '{block}' sub-block"):
        BiCodecDecoder.from_pretrained(copy_dir)


def test_config_block_without_needed_key(copy_dir: Path) -> None:
    _edit_config(copy_dir, lambda d: d["audio_tokenizer"]["decoder"].pop("rates"))
    with pytest.raises(CheckpointError, match=r"audio_tokenizer.decoder lacks 'rates'"):
        BiCodecDecoder.from_pretrained(copy_dir)


def test_unparsable_config(copy_dir: Path) -> None:
    (copy_dir / CONFIG).write_text("audio_tokenizer: [unclosed\n")
    with pytest.raises(CheckpointError, match="cannot read the BiCodec config"):
        BiCodecDecoder.from_pretrained(copy_dir)


def test_directory_without_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no BiCodec checkpoint here"):
        BiCodecDecoder.from_pretrained(tmp_path)


def test_extra_config_keys_are_accepted(copy_dir: Path) -> None:
    _edit_config(copy_dir, lambda d: d["audio_tokenizer"]["decoder"].update(training_only=1))
    assert BiCodecDecoder.from_pretrained(copy_dir).hop_length == 8 * 5 * 4 * 2


# --- the writer ---


def test_writer_is_deterministic_and_official_layout(tmp_path: Path, tiny_dir: Path) -> None:
    again = write_random_checkpoint(tmp_path / "again", "tiny", seed=3)
    other = write_random_checkpoint(tmp_path / "other", "tiny", seed=4)
    assert (again / WEIGHTS).read_bytes() == (tiny_dir / WEIGHTS).read_bytes()
    assert (again / CONFIG).read_bytes() == (tiny_dir / CONFIG).read_bytes()
    assert (other / WEIGHTS).read_bytes() != (tiny_dir / WEIGHTS).read_bytes()
    config = yaml.safe_load((tiny_dir / CONFIG).read_text())["audio_tokenizer"]
    assert set(config) == set(REAL_CONFIG)  # encode-only blocks too
    keys = set(load_file(str(tiny_dir / WEIGHTS)))
    assert {"decoder.model.1.block.1.weight_g", "quantizer.out_project.weight_v"} <= keys
    assert not any(k.startswith("decoder.") and k.endswith(".weight") for k in keys)
    encode_only = {"quantizer.in_project.weight_v", "quantizer.cluster_size"}
    assert encode_only | {"speaker_encoder.quantizer.project_in.weight"} <= keys


def test_random_weights_are_audible_not_clipped(tiny_dir: Path) -> None:
    wav = BiCodecDecoder.from_pretrained(tiny_dir).decode(*_tokens(2, 100))
    rms = float(wav.pow(2).mean().sqrt())
    assert 0.05 < rms < 0.5, rms
    assert float((wav.abs() > 0.99).float().mean()) < 0.01  # not a tanh-saturated square wave


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_real_config_loads_without_a_second_copy(tmp_path: Path) -> None:
    """Peak RSS growth while loading the real config stays well under two copies of the weights.

    Note: with safetensors' memory-mapped safe_open the growth measured ~2.3x the weights (the
    file's pages stay resident); the plain-read loader measures ~1.3x.
    """
    write_random_checkpoint(tmp_path / "BiCodec", "real")
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.load_rss", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    grown, weights = (int(x) for x in out.stdout.split())
    assert weights > 350e6  # the real config's ~96 M fp32 decode parameters
    assert grown < 1.6 * weights, (grown, weights)
