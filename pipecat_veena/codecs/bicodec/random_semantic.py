"""Random transcript-mode parts for tests: BiCodec semantic-encoder tensors, a small wav2vec2.

Kept apart from :mod:`.checkpoint` on purpose: the demo checkpoints' build key hashes that
module, and these writers do not change what the demo builder writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from pipecat_veena.codecs.bicodec.config import BiCodecConfig
from pipecat_veena.codecs.bicodec.loader import CONFIG_FILE, WEIGHTS_FILE
from pipecat_veena.codecs.bicodec.modules import official_parameters


def _semantic_encoder_tensors(
    tokenizer: dict[str, Any], source: str, gen: torch.Generator
) -> Iterator[tuple[str, Tensor]]:
    """Yield (official key, random value) for every tensor the semantic encoder reads.

    The weight-normed ``quantizer.in_project`` is written as a ``weight_g`` / ``weight_v`` pair;
    norm scales and layer scales get 1 + noise, so that the ids depend on the clip.
    """
    from pipecat_veena.codecs.bicodec.config import EncoderConfig
    from pipecat_veena.codecs.bicodec.semantic import BiCodecSemanticEncoder

    parsed = BiCodecConfig.from_dict(tokenizer, source=source)
    with torch.device("meta"):
        model = BiCodecSemanticEncoder(parsed, EncoderConfig.from_dict(tokenizer, source=source))
    for prefix, name, _, tensor, folded in official_parameters(model):
        shape, key = tuple(tensor.shape), prefix + name
        noise = torch.randn(shape, generator=gen)
        if folded:
            yield prefix + "weight_g", 1 + 0.1 * torch.rand((shape[0], 1, 1), generator=gen)
            yield prefix + "weight_v", noise
        elif key.endswith(("norm.weight", "gamma")):
            yield key, 1 + 0.1 * noise
        elif len(shape) >= 2:
            yield key, noise / math.sqrt(math.prod(shape[1:]))
        else:
            yield key, 0.1 * noise


def add_random_semantic_encoder(directory: str | Path, *, seed: int = 0) -> Path:
    """Give a BiCodec checkpoint random semantic-encoder tensors (transcript-mode tests).

    Rewrites ``model.safetensors`` in ``directory`` (a ``BiCodec/`` directory) with every
    ``encoder.*`` and ``quantizer.in_project.*`` tensor its ``config.yaml`` calls for, in the
    official names; the other tensors are kept. The same seed writes the same values.

    Returns:
        The directory.
    """
    from safetensors.torch import load_file

    from pipecat_veena.codecs.bicodec.config import read_audio_tokenizer

    directory = Path(directory)
    tokenizer = dict(read_audio_tokenizer(directory / CONFIG_FILE))
    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(str(directory / WEIGHTS_FILE))
    for key, value in _semantic_encoder_tensors(tokenizer, str(directory), gen):
        tensors[key] = value.contiguous()
    save_file(tensors, str(directory / WEIGHTS_FILE))
    return directory


def write_random_wav2vec2(
    directory: str | Path, *, hidden_size: int = 64, layers: int = 17, seed: int = 0
) -> Path:
    """Write a small random wav2vec2 model in the ``wav2vec2-large-xlsr-53`` layout (tests).

    The XLSR-53 architecture (layer-normed conv feature encoder with its 320x stride, stable
    layer norm, the feature extractor's zero-mean unit-variance inputs) at small widths.

    Args:
        directory: where to write (``config.json``, weights, ``preprocessor_config.json``).
        hidden_size: the transformer width (the BiCodec encoder's ``input_channels``).
        layers: transformer layers (Spark-TTS reads hidden states up to 16, so at least 16).
        seed: the same seed writes the same weights.

    Returns:
        The directory written.
    """
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model

    config = Wav2Vec2Config(
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        conv_dim=(32,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
        conv_bias=True,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Wav2Vec2Model(config).eval()
    finally:
        torch.random.set_rng_state(state)
    directory = Path(directory)
    model.save_pretrained(str(directory))
    Wav2Vec2FeatureExtractor(
        feature_size=1,
        sampling_rate=16000,
        padding_value=0.0,
        do_normalize=True,
        return_attention_mask=True,
    ).save_pretrained(str(directory))
    return directory
