"""Demo checkpoints: layout, tokenizers, determinism, loadability, and the LLM grammar through the
real vLLM CPU engine (greedy and at the engine's default sampling).

Prompts are built with the engine's own prompt formats (``pipecat_veena.engine.prompts``); the
checks read raw token ids, so a wrong count or order anywhere fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer

from pipecat_veena.demo import DEMO_KINDS, build_demo_checkpoint
from pipecat_veena.demo.build import MARKER
from pipecat_veena.demo.spark import SPEAKERS, spark_grammar
from pipecat_veena.engine import Voice
from pipecat_veena.engine.prompts import SparkPrompts, TextEncoder, VeenaPrompts
from pipecat_veena.engine.tokens import BiCodecIds, SnacIds, SnacParser
from pipecat_veena.generation.base import SamplingOptions
from pipecat_veena.generation.grammar import SnacGrammar

TEXTS = {
    "en-short": "Hi there.",
    "hi-short": "नमस्ते!",
    "en": "The meeting starts at ten, in room B-12.",
    "hi": "आज मौसम बहुत अच्छा है, चलो बाहर चलते हैं।",
    "mixed": "आज का meeting बहुत productive था, thanks!",
    "symbols": "Is x < y | z > w? Yes <laugh> it is.",
    "en-long": (
        "Streaming speech should start quickly; voice agents need low latency, natural prosody "
        "and clear words."
    ),
}
GREEDY = SamplingOptions(temperature=0.0, max_tokens=1500)
SAMPLED = SamplingOptions(temperature=0.8, top_k=50, top_p=1.0, max_tokens=1500)


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def test_unknown_kind_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="spark, spark-tiny, veena"):
        build_demo_checkpoint("orpheus", tmp_path)


@pytest.mark.slow
def test_build_is_deterministic_and_cached(tmp_path: Path) -> None:
    """Two builds in two directories give the same bytes, file by file; a rebuild reuses."""
    roots = {}
    for name in ("a", "b"):
        for kind in ("spark-tiny", "veena"):
            roots[name, kind] = build_demo_checkpoint(kind, tmp_path / name, _steps=4)
    for kind in ("spark-tiny", "veena"):
        first, second = _hashes(roots["a", kind]), _hashes(roots["b", kind])
        assert len(first) >= 8
        assert first == second, f"{kind}: files differ between two builds"
    llms_a, llms_b = _hashes(tmp_path / "a" / ".llms"), _hashes(tmp_path / "b" / ".llms")
    assert llms_a == llms_b
    marker = roots["a", "veena"] / MARKER
    stamp = marker.stat().st_mtime_ns
    assert build_demo_checkpoint("veena", tmp_path / "a", _steps=4) == roots["a", "veena"]
    assert marker.stat().st_mtime_ns == stamp, "a current build must be reused"
    assert not list((tmp_path / "a").glob(".tmp-*")), "temporary build directories left behind"


@pytest.mark.slow
def test_training_logs_a_few_lines_when_not_a_terminal(tmp_path: Path) -> None:
    """Where stderr is a log (CI), the training progress is ten INFO lines, not a tqdm bar that
    writes a line per refresh."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "pipecat_veena.demo._worker", str(tmp_path), "20"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
    assert "\r" not in done.stderr, "a progress bar wrote into the log"
    lines = [line for line in done.stderr.splitlines() if "demo LLMs: step" in line]
    assert len(lines) == 10 and "step 20/20" in lines[-1], done.stderr[-2000:]
    assert (tmp_path / "spark" / "model.safetensors").is_file()


@pytest.mark.slow
def test_openmp_waiting_changes_no_trained_byte(tmp_path: Path) -> None:
    """The build picks how the training child's OpenMP threads wait by how busy the CPUs are:
    the choice may change the time, never the checkpoint."""
    import subprocess
    import sys

    hashes = []
    for name, policy in (
        ("spin", {"GOMP_SPINCOUNT": "3000"}),
        ("passive", {"OMP_WAIT_POLICY": "PASSIVE"}),
    ):
        env = {
            k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
        }
        cmd = [sys.executable, "-m", "pipecat_veena.demo._worker", str(tmp_path / name), "6"]
        subprocess.run(cmd, env={**env, **policy}, capture_output=True, check=True, timeout=900)
        hashes.append(_hashes(tmp_path / name))
    assert hashes[0] == hashes[1] and len(hashes[0]) > 4


def test_openmp_waiting_follows_the_idle_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipecat_veena.demo.build import _idle_cpus, _omp_wait

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert _omp_wait(lambda: 2.0) == {"GOMP_SPINCOUNT": "3000"}
    assert _omp_wait(lambda: 1.0) == {"OMP_WAIT_POLICY": "PASSIVE"}
    idle = _idle_cpus(0.05)
    assert 0.0 <= idle <= (os.cpu_count() or 1) + 1e-6
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")

    def not_sampled() -> float:
        raise AssertionError("the CPUs were sampled although the caller set a policy")

    assert _omp_wait(not_sampled) == {}, "the caller's own policy wins"


def test_spark_layout(spark_tiny_checkpoint: Path) -> None:
    root = spark_tiny_checkpoint
    for rel in (
        "LLM/config.json", "LLM/model.safetensors", "LLM/tokenizer.json",
        "LLM/tokenizer_config.json", "BiCodec/config.yaml", "BiCodec/model.safetensors",
        "config.yaml", "voices.json", "README.md",
    ):  # fmt: skip
        assert (root / rel).is_file(), rel
    top = yaml.safe_load((root / "config.yaml").read_text())
    assert top["sample_rate"] == 16000 and top["latent_hop_length"] == 320
    assert top["ref_segment_duration"] == 6 and top["volume_normalize"] is True
    assert "audio_tokenizer" in yaml.safe_load((root / "BiCodec/config.yaml").read_text())
    config = json.loads((root / "LLM/config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] >= 32
    assert "sound, not words" in (root / "README.md").read_text()
    voices = json.loads((root / "voices.json").read_text())
    assert voices["format"] == "veena3"
    assert voices["template"].endswith("<|start_global_token|>")
    assert voices["default_voice"] in voices["voices"]
    assert voices["emotion_tags"] == ["<laugh>", "<sigh>", "<happy>", "<sad>"]
    for name, spec in voices["voices"].items():
        assert spec["speaker"] == f"<|speaker_{name}|>"
        assert len(spec.get("globals", [0] * 32)) == 32


@pytest.mark.parametrize("kind", ["spark", "spark-tiny"])
def test_spark_demos_enrol_voices_with_their_speaker_encoder(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from speech import espeak

    from pipecat_veena.codecs.bicodec.encoder import BiCodecSpeakerEncoder

    root = request.getfixturevalue(
        "spark_checkpoint" if kind == "spark" else "spark_tiny_checkpoint"
    )
    encoder = BiCodecSpeakerEncoder.from_pretrained(root)  # official keys, random values
    voices = {
        tuple(encoder.tokenize(espeak(tmp_path, voice, 160, pitch, 1)))
        for voice, pitch in (("en+f3", 70), ("en+m3", 30), ("de", 50))
    }
    assert len(voices) == 3 and all(len(v) == 32 for v in voices)


def test_veena_layout_and_snac_loads(veena_checkpoint: Path) -> None:
    import snac

    root = veena_checkpoint
    config = json.loads((root / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["head_dim"] >= 32 and config["vocab_size"] >= 128266 + 7 * 4096
    assert "sound, not words" in (root / "README.md").read_text()
    codec_config = json.loads((root / "snac_24khz/config.json").read_text())
    assert codec_config["sampling_rate"] == 24000 and codec_config["vq_strides"] == [4, 2, 1]
    model = snac.SNAC.from_pretrained(str(root / "snac_24khz"))
    assert model.hop_length == 512


@pytest.mark.parametrize("kind", ["spark-tiny", "veena"])
def test_control_and_codec_tokens_are_single_ids(kind: str, request: pytest.FixtureRequest) -> None:
    from transformers import AutoTokenizer

    root = request.getfixturevalue(f"{kind.replace('-', '_')}_checkpoint")
    llm = root / "LLM" if kind != "veena" else root
    fast = Tokenizer.from_file(str(llm / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(llm))
    if kind == "veena":
        tokens = [f"<custom_token_{n}>" for n in range(10 + 7 * 4096)]
        tokens += ["<spk_kavya>", "<spk_agastya>", "<spk_maitri>", "<spk_vinaya>"]
    else:
        tokens = [t for t in fast.get_added_tokens_decoder().values()]
        tokens = [t.content for t in tokens]
        assert {"<|speaker_lipakshi|>", "<laugh>", "<|pitch_value_1000|>"} <= set(tokens)
    for tok_ids in (
        fast.encode_batch(tokens, add_special_tokens=False),
        auto(tokens, add_special_tokens=False)["input_ids"],
    ):
        ids = [getattr(e, "ids", e) for e in tok_ids]
        bad = [t for t, i in zip(tokens, ids, strict=True) if len(i) != 1]
        assert not bad, f"not one id: {bad[:5]}"
        assert [i[0] for i in ids] == [fast.token_to_id(t) for t in tokens]
    if kind == "veena":
        exact = {"<custom_token_3>": 128259, "<custom_token_4>": 128260, "<custom_token_1>": 128257}
        exact |= {"<custom_token_2>": 128258, "<custom_token_6>": 128262}
        exact |= {"<custom_token_10>": 128266, f"<custom_token_{10 + 6 * 4096 + 4095}>": 156937}
        assert {t: fast.token_to_id(t) for t in exact} == exact
        assert SnacIds.from_lookup(fast.token_to_id).audio_base == 128266
    else:
        BiCodecIds.from_lookup(fast.token_to_id)  # contiguous codec ids, every marker present
    assert len(fast.encode("any text, कोई भी पाठ ✓ \x00", add_special_tokens=False).ids) > 0


@pytest.mark.parametrize("kind", ["spark-tiny", "veena"])
def test_llm_loads_in_transformers(kind: str, request: pytest.FixtureRequest) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = request.getfixturevalue(f"{kind.replace('-', '_')}_checkpoint")
    llm = root / "LLM" if kind != "veena" else root
    model = AutoModelForCausalLM.from_pretrained(str(llm))
    tok = AutoTokenizer.from_pretrained(str(llm))
    assert model.config.vocab_size >= len(tok)
    ids = torch.tensor([tok.encode("hello", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_demo_llms_train_under_the_engines_grammar(
    spark_tiny_checkpoint: Path, veena_checkpoint: Path
) -> None:
    """The grammar states the demo LLMs' loss is taken over are the ones the engine masks with
    for these checkpoints (``demo/train.py``: a target competes only with what its state allows)."""
    from pipecat_veena.demo import spark, veena
    from pipecat_veena.engine import detect_layout
    from pipecat_veena.engine.formats import SnacFormat, load_tokenizer

    tok = Tokenizer.from_file(str(spark_tiny_checkpoint / "LLM" / "tokenizer.json"))
    engine = _spark_format(spark_tiny_checkpoint).grammar(Voice("m", gender=1), prefilled=False)
    assert spark.codec_grammar(tok).rules == engine.rules
    assert spark.spark_task(tok).rules == spark.training_rules(engine)
    layout = detect_layout(veena_checkpoint)
    snac = SnacFormat(layout, load_tokenizer(layout.llm_dir))
    engine = snac.grammar(Voice("kavya", speaker="kavya"), prefilled=False)
    assert veena.snac_grammar().rules == engine.rules
    assert veena.veena_task(veena.veena_tokenizer()).rules == engine.rules


# --- grammar through the real vLLM CPU engine -------------------------------------------------


def _spark_setup(root: Path):
    tok = Tokenizer.from_file(str(root / "LLM" / "tokenizer.json"))
    voices = json.loads((root / "voices.json").read_text())
    ids = BiCodecIds.from_lookup(tok.token_to_id)
    prompts = SparkPrompts(ids, TextEncoder(tok, voices["emotion_tags"]), voices["template"])
    return tok, ids, prompts, spark_grammar(tok)


def _spark_voices(grammar) -> dict[str, tuple[Voice, tuple[int, ...] | None]]:
    """Voices of every prompt form, with the globals the demo must emit (None: prefilled)."""
    rng = random.Random(3)
    unseen = tuple(rng.randrange(4096) for _ in range(32))
    ctl, spk = grammar.controllable_globals, grammar.speaker_globals
    return {
        "controllable": (Voice("m", gender=1, pitch=3, speed=0), ctl(1, 3, 0)),
        "controllable-f": (Voice("f", gender=0, pitch=1, speed=4), ctl(0, 1, 4)),
        "named": (Voice("nilay", speaker="<|speaker_nilay|>"), spk["nilay"]),
        "named-default": (Voice("lipakshi", speaker="<|speaker_lipakshi|>"), spk["lipakshi"]),
        "fixed": (Voice("meera", globals=spk["meera"]), None),
        "unseen-globals": (Voice("clone", globals=unseen), None),
    }


def _spark_parse(
    out: list[int], ids: BiCodecIds, controllable: bool, prefilled: bool, prompt: list[int]
) -> dict:
    """Check the Spark grammar strictly; return the globals and the semantic count.

    The engine's prompts may end with ``<|start_semantic_token|>`` (filled-in globals): the
    output then starts with the semantic codes.
    """
    m = ids.markers
    if prompt[-1] == m["start_semantic_token"]:
        out = [m["start_semantic_token"], *out]
    pos = 0
    if controllable:
        assert out[0] == m["start_acoustic_token"] and out[3] == m["end_acoustic_token"], out[:6]
        assert out[4] == m["start_global_token"], out[:6]
        pos = 5
    glob: list[int] = []
    if not prefilled:
        glob = [t - ids.global_base for t in out[pos : pos + 32]]
        assert all(0 <= g < 4096 for g in glob), out[pos : pos + 33]
        assert out[pos + 32] == m["end_global_token"], out[pos : pos + 34]
        pos += 33
    assert out[pos] == m["start_semantic_token"], out[pos - 2 : pos + 2]
    sem = out[pos + 1 : -1]
    assert out[-1] == ids.eos, "no <|im_end|> at the end"
    stray = [(i, t) for i, t in enumerate(sem) if not 0 <= t - ids.semantic_base < 8192]
    assert sem and not stray, f"{len(sem)} semantic-part ids, not semantic: {stray[:5]}"
    return {"globals": tuple(glob), "semantics": len(sem)}


async def _generate(generator, prompts: list[list[int]], options: SamplingOptions, stop) -> list:
    async def one(i: int, prompt: list[int]) -> list[int]:
        out: list[int] = []
        opts = replace(options, stop_token_ids=stop, seed=i + 1000 * (options.seed or 0))
        async for delta in generator.generate(prompt, opts, f"demo-{random.random()}-{i}"):
            out.extend(delta.token_ids)
        return out

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def _spark_cases(root: Path):
    tok, ids, prompts, grammar = _spark_setup(root)
    cases = []
    for form, (voice, expected) in _spark_voices(grammar).items():
        for name, text in TEXTS.items():
            cases.append((form, name, voice, expected, prompts.build(text, voice)))
    return ids, prompts, cases


def _spark_format(root: Path):
    from pipecat_veena.engine import detect_layout
    from pipecat_veena.engine.formats import BiCodecFormat, load_tokenizer

    layout = detect_layout(root)
    return BiCodecFormat(layout, load_tokenizer(layout.llm_dir), 32)


def _check_parses(parser, out: list[int], options: SamplingOptions) -> list[int]:
    """The engine's own parser accepts the stream, which ended with a stop or at the cap."""
    codes = parser.feed(out)  # MalformedStreamError on any fault
    assert codes, "no codec codes"
    assert parser.done or len(out) == options.max_tokens, "ended without a stop before the cap"
    return codes


@pytest.mark.vllm
@pytest.mark.parametrize("options", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
async def test_spark_grammar_holds_for_every_prompt_form(
    spark_generator, spark_tiny_checkpoint: Path, options: SamplingOptions
) -> None:
    """With the engine's grammar constraint, every prompt form and text gives a stream that the
    engine's parser accepts, whatever the demo LLM learned on this machine (how well it follows
    the exact Spark format unconstrained is a benchmark figure: benchmarks/demo.py)."""
    fmt = _spark_format(spark_tiny_checkpoint)
    start_semantic = fmt.ids.marker("start_semantic_token")
    _, prompts, cases = _spark_cases(spark_tiny_checkpoint)
    constrained = []
    for _, _, voice, _, prompt in cases:
        grammar = fmt.grammar(voice, prefilled=prompt[-1] == start_semantic)
        constrained.append(replace(options, grammar=grammar))
    outs = await asyncio.gather(
        *(
            _generate(spark_generator, [case[-1]], opts, prompts.stop_ids)
            for case, opts in zip(cases, constrained, strict=True)
        )
    )
    for (form, name, _, _, prompt), (out,), opts in zip(cases, outs, constrained, strict=True):
        parser = fmt.parser(prefilled=prompt[-1] == start_semantic)
        try:
            _check_parses(parser, out, opts)
        except Exception as e:
            raise AssertionError(f"{form}/{name}: {e}") from e
        assert len(parser.globals) in (0, 32)


def _veena_setup(root: Path):
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    ids = SnacIds.from_lookup(tok.token_to_id)
    return ids, VeenaPrompts(ids, TextEncoder(tok))


def _veena_frames(out: list[int], ids: SnacIds) -> int:
    """Check whole frames in slot order then END_OF_SPEECH; return the frame count."""
    assert out[-1] == ids.end_of_speech, "no END_OF_SPEECH at the end"
    codes = out[:-1]
    assert codes and len(codes) % 7 == 0, f"{len(codes)} codes: not whole frames"
    for i, t in enumerate(codes):
        code = t - ids.audio_base - (i % 7) * ids.codebook_size
        assert 0 <= code < ids.codebook_size, f"id {t} at slot {i % 7}"
    return len(codes) // 7


@pytest.mark.vllm
@pytest.mark.parametrize("options", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
async def test_veena_grammar_holds_for_every_speaker(
    veena_generator, veena_checkpoint: Path, options: SamplingOptions
) -> None:
    """Constrained to the SNAC grammar, every stream is whole frames in slot order."""
    ids, prompts = _veena_setup(veena_checkpoint)
    grammar = SnacGrammar(ids.audio_base, ids.codebook_size, ids.slots, prompts.stop_ids)
    options = replace(options, grammar=grammar)
    cases = [(s, n) for s in ("kavya", "agastya", "maitri", "vinaya") for n in TEXTS]
    built = [prompts.build(TEXTS[n], Voice(s, speaker=s)) for s, n in cases]
    outs = await _generate(veena_generator, built, options, prompts.stop_ids)
    for (speaker, name), out in zip(cases, outs, strict=True):
        parser = SnacParser(ids)
        try:
            codes = _check_parses(parser, out, options)
        except Exception as e:
            raise AssertionError(f"{speaker}/{name}: {e}") from e
        assert not parser.done or len(codes) % 7 == 0, f"{speaker}/{name}: a partial frame"


def test_demo_kinds() -> None:
    assert DEMO_KINDS == ("spark", "spark-tiny", "veena")
    assert len(SPEAKERS) >= 3
