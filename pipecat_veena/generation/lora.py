"""LoRA adapters: a fine-tuned voice served on the base model (vLLM multi-LoRA).

An adapter is a PEFT directory (``adapter_config.json`` + ``adapter_model.safetensors`` or
``adapter_model.bin``). This module owns that layout, an adapter's rank, and the vLLM engine
arguments that make room for a set of adapters (one id per adapter, all on one base model).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter the generator applies to the requests that name it.

    Attributes:
        name: a readable name (the first voice that uses it).
        path: the adapter directory (absolute).
        rank: the largest LoRA rank in it (``r``, or its ``rank_pattern``).
        id: its id in the generator, unique per adapter, from 1.
    """

    name: str
    path: Path
    rank: int
    id: int


def load_adapter(path: str | Path, name: str, adapter_id: int) -> LoraAdapter:
    """Check a PEFT LoRA directory and read its rank.

    Raises:
        ValueError: the directory, its config or its weights are missing or not a LoRA,
            naming what to provide.
    """
    root = Path(path).expanduser().resolve()
    config_path = root / ADAPTER_CONFIG
    if not root.is_dir():
        raise ValueError(
            f"LoRA adapter {root} does not exist: point 'lora' to a PEFT adapter directory "
            f"({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS[0]}; a relative path is read from the "
            "checkpoint directory)"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"LoRA adapter {root}: cannot read {ADAPTER_CONFIG}: {e}") from e
    if not any((root / w).is_file() for w in ADAPTER_WEIGHTS):
        raise ValueError(
            f"LoRA adapter {root}: no weights; expected {' or '.join(ADAPTER_WEIGHTS)} "
            "(save the adapter with PEFT's save_pretrained)"
        )
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else config
        raise ValueError(f"LoRA adapter {root}: {ADAPTER_CONFIG} is not a LoRA config ({kind!r})")
    ranks = [config.get("r"), *(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in ranks):
        raise ValueError(
            f"LoRA adapter {root}: {ADAPTER_CONFIG} needs a positive integer rank 'r', "
            f"got {config.get('r')!r}"
        )
    return LoraAdapter(name=name, path=root, rank=max(ranks), id=adapter_id)


def lora_engine_args(adapters: Sequence[LoraAdapter], allowed_ranks: Sequence[int]) -> dict:
    """vLLM engine arguments that serve ``adapters`` together ({} when there are none).

    Every adapter stays resident (``max_loras`` and ``max_cpu_loras`` are their count), and
    ``max_lora_rank`` is the smallest rank vLLM offers that fits the largest adapter.

    Args:
        adapters: the adapters to serve.
        allowed_ranks: the values vLLM accepts for ``max_lora_rank``.

    Raises:
        ValueError: an adapter whose rank is above the largest vLLM offers.
    """
    if not adapters:
        return {}
    largest = max(adapters, key=lambda a: a.rank)
    fits = [r for r in sorted(allowed_ranks) if r >= largest.rank]
    if not fits:
        raise ValueError(
            f"LoRA adapter {largest.path} has rank {largest.rank}; vLLM serves ranks up to "
            f"{max(allowed_ranks)}: train it with a smaller r"
        )
    count = len({a.id for a in adapters})
    return {
        "enable_lora": True,
        "max_loras": count,
        "max_cpu_loras": count,
        "max_lora_rank": fits[0],
    }


def lora_request(adapter: LoraAdapter) -> Any:
    """The vLLM ``LoRARequest`` of ``adapter`` (vLLM imported here)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(adapter.name, adapter.id, str(adapter.path))
