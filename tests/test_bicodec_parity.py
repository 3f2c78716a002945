"""Parity of BiCodecDecoder with an independent implementation: flashtts 0.1.7's BiCodec modules.

The reference is built with random weights (every tensor perturbed, see ReferenceDetokenizer),
its full state dict is saved in the official layout (legacy weight_g / weight_v, encode-only
tensors included) and loaded with our loader. flashtts is installed by the Makefile: a missing
flashtts fails these tests, it does not skip them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipecat_veena.codecs.bicodec import BiCodecDecoder
from pipecat_veena.codecs.bicodec.checkpoint import REAL_CONFIG, TINY_CONFIG
from pipecat_veena.codecs.bicodec.reference import ReferenceDetokenizer

ENCODE_ONLY = (
    "quantizer.in_project.",
    "quantizer.cluster_size",
    "speaker_encoder.speaker_encoder.",
    "speaker_encoder.perceiver_sampler.",
    "speaker_encoder.quantizer.project_in.",
)


def _tokens(batch: int, steps: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    semantic = torch.randint(0, 8192, (batch, steps), generator=gen)
    globals_ = torch.randint(0, 4096, (batch, 32), generator=gen)
    return semantic, globals_


@pytest.mark.parametrize(
    ("name", "config", "batch", "steps"),
    [("tiny", TINY_CONFIG, 4, 256), ("real", REAL_CONFIG, 3, 200)],
)
def test_matches_flashtts_reference(
    tmp_path: Path, name: str, config: dict, batch: int, steps: int
) -> None:
    torch.manual_seed(0)
    reference = ReferenceDetokenizer(config).randomize(seed=1).eval()
    reference.save(tmp_path / "BiCodec", config)
    ours = BiCodecDecoder.from_pretrained(tmp_path)  # checkpoint root containing BiCodec/

    # Every decode parameter of the reference is accounted for, nothing else is loaded
    # (weight norm's magnitudes g are folded into the weights, so they are not counted).
    decode_params = sum(
        p.numel()
        for k, p in reference.named_parameters()
        if not k.startswith(ENCODE_ONLY) and not k.endswith("weight_g")
    )
    assert sum(p.numel() for p in ours.parameters()) == decode_params

    semantic, globals_ = _tokens(batch, steps, seed=2)  # one global set per batch item
    expected = reference(semantic, globals_)[:, 0]
    got = ours.decode(semantic, globals_)
    assert got.shape == (batch, steps * ours.hop_length) == expected.shape
    assert float(expected.pow(2).mean().sqrt()) > 1e-3, "reference output is silent"
    assert float((got - expected).abs().max()) <= 1e-5


def test_reference_runs_on_the_real_einx() -> None:
    """flashtts's residual FSQ gathers with einx: the parity above ran the real package."""
    import einx

    assert "site-packages" in einx.__file__
