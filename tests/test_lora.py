"""LoRA adapter voices without vLLM: the voices file, the engine arguments, the routing.

A voice of ``voices.json`` may name a PEFT LoRA adapter directory; the real vLLM CPU engine
serving them is tested in test_lora_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest
from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids, well_formed
from lora_adapters import write_lora_adapter

from pipecat_veena.engine import EngineConfig, VeenaEngine, spark_voices, veena_voices
from pipecat_veena.errors import CheckpointError
from pipecat_veena.generation.lora import LoraAdapter, lora_engine_args
from pipecat_veena.streaming import StreamConfig

TINY_LLM = {
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
}
VOICE = list(range(40, 72))


def _adapter(root: Path, name: str, *, rank: int = 8) -> Path:
    model = root / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY_LLM))
    return write_lora_adapter(root / name, model, seed=len(name), rank=rank)


def _veena_root(tmp_path: Path, voices: dict) -> Path:
    (tmp_path / "voices.json").write_text(json.dumps({"default_voice": "kavya", "voices": voices}))
    return tmp_path


def test_voices_file_names_adapters_one_per_directory(tmp_path):
    _adapter(tmp_path, "adapters/asha")
    elsewhere = _adapter(tmp_path / "other", "ravi", rank=12)
    root = _veena_root(
        tmp_path,
        {
            "kavya": {"speaker": "kavya"},
            "Asha": {"speaker": "kavya", "lora": "adapters/asha"},
            "asha-slow": {"lora": "./adapters/../adapters/asha"},
            "ravi": {"lora": str(elsewhere)},
        },
    )
    book = veena_voices(root)
    asha, slow, ravi = (book.resolve(n) for n in ("asha", "asha-slow", "ravi"))
    assert book.resolve("kavya").adapter is None
    assert asha.adapter == slow.adapter  # the same directory: one adapter, one id
    assert asha.adapter.path == (tmp_path / "adapters" / "asha").resolve()
    assert (asha.adapter.id, asha.adapter.rank, asha.adapter.name) == (1, 8, "asha")
    assert (ravi.adapter.id, ravi.adapter.rank) == (2, 12)
    assert slow.speaker == "asha-slow" and asha.speaker == "kavya"
    assert book.adapters == [asha.adapter, ravi.adapter]
    assert book.names == ["kavya", "asha", "asha-slow", "ravi"]  # listed like any voice


def test_bicodec_voices_file_takes_adapters_too(tmp_path):
    _adapter(tmp_path, "asha")
    (tmp_path / "voices.json").write_text(
        json.dumps(
            {"voices": {"asha": {"globals": VOICE, "lora": "asha"}, "plain": {"globals": VOICE}}}
        )
    )
    book = spark_voices(tmp_path, 32)
    assert book.resolve("asha").adapter.rank == 8
    assert book.resolve("plain").adapter is None


@pytest.mark.parametrize(
    ("lora", "spoil", "message"),
    [
        ("missing", None, "missing does not exist: point 'lora' to a PEFT adapter directory"),
        ("a", "adapter_model.safetensors", "no weights; expected adapter_model.safetensors"),
        ("a", "adapter_config.json", "cannot read adapter_config.json"),
        (3, None, "'lora' must be the path of a LoRA adapter directory, got 3"),
        ("", None, "'lora' must be the path of a LoRA adapter directory"),
    ],
)
def test_bad_adapters_name_the_voice_and_the_fix(tmp_path, lora, spoil, message):
    _adapter(tmp_path, "a")
    if spoil:
        (tmp_path / "a" / spoil).unlink()
    root = _veena_root(tmp_path, {"kavya": {}, "asha": {"lora": lora}})
    with pytest.raises(CheckpointError, match="voice 'asha'") as e:
        veena_voices(root)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"peft_type": "PREFIX_TUNING"}, "is not a LoRA config ('PREFIX_TUNING')"),
        ({"r": 0}, "needs a positive integer rank 'r', got 0"),
        ({"r": "8"}, "needs a positive integer rank 'r'"),
    ],
)
def test_adapter_configs_that_are_not_lora_are_refused(tmp_path, edit, message):
    path = _adapter(tmp_path, "a") / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    with pytest.raises(CheckpointError, match="voice 'asha'") as e:
        veena_voices(_veena_root(tmp_path, {"kavya": {}, "asha": {"lora": "a"}}))
    assert message in str(e.value)


def test_rank_pattern_counts_for_the_rank(tmp_path):
    path = _adapter(tmp_path, "a") / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rank_pattern": {"q_proj": 32}}))
    book = veena_voices(_veena_root(tmp_path, {"kavya": {}, "asha": {"lora": "a"}}))
    assert book.resolve("asha").adapter.rank == 32


def test_engine_args_make_room_for_every_adapter_and_the_largest_rank():
    from vllm.config.lora import MaxLoRARanks

    ranks = get_args(MaxLoRARanks)  # what this vLLM accepts for max_lora_rank
    a = LoraAdapter("a", Path("/a"), 4, 1)
    b = LoraAdapter("b", Path("/b"), 12, 2)
    assert lora_engine_args([], ranks) == {}
    assert lora_engine_args([a], ranks) == {
        "enable_lora": True,
        "max_loras": 1,
        "max_cpu_loras": 1,
        "max_lora_rank": 8,
    }
    args = lora_engine_args([a, b], ranks)
    assert (args["max_loras"], args["max_lora_rank"]) == (2, 16)
    with pytest.raises(ValueError, match=f"serves ranks up to {max(ranks)}: train it"):
        lora_engine_args([LoraAdapter("c", Path("/c"), max(ranks) + 1, 3)], ranks)


async def test_each_voice_generates_with_its_own_adapter(tmp_path):
    ids = spark_ids()
    root = make_checkpoint(tmp_path)
    _adapter(tmp_path, "adapters/asha")
    _adapter(tmp_path, "adapters/ravi")
    voices = {
        "plain": {"globals": VOICE},
        "asha": {"globals": VOICE, "lora": "adapters/asha"},
        "ravi": {"globals": VOICE, "lora": "adapters/ravi"},
    }
    (root / "voices.json").write_text(json.dumps({"voices": voices}))
    generator = ScriptedGenerator(well_formed(ids, voice_globals=VOICE, semantics=12))
    config = EngineConfig(
        checkpoint=root,
        warmup=False,
        max_part_chars=20,
        stream=StreamConfig(first_frames=4, lookahead_frames=4, max_chunk_frames=64),
    )
    engine = VeenaEngine(config, generator=generator, codec=FakeBiCodec())
    await engine.start()
    try:
        for voice in ("asha", "plain", "ravi", "asha"):
            # two parts: every part of an utterance keeps the voice's adapter
            async for _ in engine.stream("First part here. Second part here.", voice=voice):
                pass
        used = [o.adapter.name if o.adapter else None for o in generator.options]
        assert used == ["asha", "asha", None, None, "ravi", "ravi", "asha", "asha"]
        with pytest.raises(ValueError, match="unknown sampling option"):
            engine.check_options(adapter=generator.options[0].adapter)  # the voice sets it
    finally:
        await engine.shutdown()
