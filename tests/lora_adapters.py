"""Small random LoRA adapters in PEFT's layout, written without ``peft`` (deterministic by seed)."""

from __future__ import annotations

import json
from pathlib import Path

#: The Llama/Qwen projections a LoRA adapter usually targets, and their block.
_MODULES = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


def _shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of a Llama-style ``config.json``."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def write_lora_adapter(
    out: Path, model_dir: Path, *, seed: int, rank: int = 8, scale: float = 0.5
) -> Path:
    """Write a random LoRA adapter for the LLM in ``model_dir`` (``adapter_config.json`` and
    ``adapter_model.safetensors``, as PEFT saves them) into ``out``; returns ``out``.

    Unlike PEFT's initialisation (B = 0), both factors are random, so the adapter changes the
    model's output from the first token.
    """
    import torch
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text())
    shapes = _shapes(config)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, block in _MODULES.items():
            fan_in, fan_out = shapes[module]
            key = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) * scale
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * scale
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "target_modules": list(_MODULES),
        "base_model_name_or_path": str(model_dir),
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1))
    return out
