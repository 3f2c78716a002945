"""The Spark-TTS-layout demo: its token grammar, training data and checkpoint files.

The demo LLM learns the real Spark-TTS / Veena3 grammar on synthetic data:
- semantics are a fixed function of the text: each text id becomes ``SEMANTICS_PER_TOKEN``
  semantic codes (about 50 per second of speech at ~10 text ids per second), then ``<|im_end|>``;
- globals are a fixed function of the voice: the controllable labels (gender, pitch, speed each
  pick a fixed run of codes) or the named speaker (a fixed 32-code run);
- prompts with the globals already filled in (any 32 codes) get the semantic part only.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from tokenizers import Tokenizer

from pipecat_veena.demo.corpus import MAX_PART_CHARS, TextSampler
from pipecat_veena.demo.tokenizer import (
    BPE_VOCAB_SIZE,
    EMOTION_TAGS,
    NUM_GLOBAL_CODES,
    NUM_LEVELS,
    NUM_SEMANTIC_CODES,
    build_spark_tokenizer,
    plain_ids,
    save_hf_tokenizer,
)
from pipecat_veena.demo.train import Example, Task
from pipecat_veena.generation.grammar import BiCodecGrammar, Rule

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SPEAKERS = ("lipakshi", "nilay", "aarav", "meera")
DEFAULT_SPEAKER = "lipakshi"
#: Speakers whose voices.json entry also pins their globals (a fixed voice).
FIXED_SPEAKERS = ("meera",)
SEMANTICS_PER_TOKEN = 4
NUM_GLOBALS = 32
#: Codes of the controllable globals: a gender run, then a pitch run, then a speed run.
LABEL_RUNS = (11, 11, 10)
TEMPLATE = "<|task_tts|><|start_content|>{speaker}{text}<|end_content|><|start_global_token|>"
MAX_TEXT_TOKENS = 72
SEED = 1234

#: Top-level ``config.yaml`` of Spark-TTS-0.5B.
TOP_CONFIG = {
    "highpass_cutoff_freq": 40,
    "sample_rate": 16000,
    "segment_duration": 2.4,
    "max_val_duration": 12,
    "latent_hop_length": 320,
    "ref_segment_duration": 6,
    "volume_normalize": True,
}


def speaker_tag(name: str) -> str:
    """The added token of a named speaker."""
    return f"<|speaker_{name}|>"


@dataclass(frozen=True)
class SparkGrammar:
    """Token maps of the demo: text id -> semantic codes, voice -> 32 global codes."""

    semantics: dict[int, tuple[int, ...]]
    label_runs: tuple[tuple[tuple[int, ...], ...], ...]
    speaker_globals: dict[str, tuple[int, ...]]

    @classmethod
    def create(cls, text_ids: list[int], seed: int = SEED) -> SparkGrammar:
        """Draw the maps from ``seed`` (disjoint codes, so each code names its place)."""
        rng = random.Random(seed)
        sem = rng.sample(range(NUM_SEMANTIC_CODES), len(text_ids) * SEMANTICS_PER_TOKEN)
        k = SEMANTICS_PER_TOKEN
        semantics = {t: tuple(sem[i * k : (i + 1) * k]) for i, t in enumerate(text_ids)}
        counts = (2, NUM_LEVELS, NUM_LEVELS)
        total = sum(c * n for c, n in zip(counts, LABEL_RUNS, strict=True))
        glob = iter(rng.sample(range(NUM_GLOBAL_CODES), total + NUM_GLOBALS * len(SPEAKERS)))
        runs = tuple(
            tuple(tuple(next(glob) for _ in range(n)) for _ in range(c))
            for c, n in zip(counts, LABEL_RUNS, strict=True)
        )
        speakers = {s: tuple(next(glob) for _ in range(NUM_GLOBALS)) for s in SPEAKERS}
        return cls(semantics, runs, speakers)

    def controllable_globals(self, gender: int, pitch: int, speed: int) -> tuple[int, ...]:
        """The 32 global codes of a controllable voice."""
        gender_run, pitch_run, speed_run = self.label_runs
        return gender_run[gender] + pitch_run[pitch] + speed_run[speed]

    def used_globals(self) -> set[int]:
        """Every global code a voice of the demo uses."""
        codes = {c for runs in self.label_runs for run in runs for c in run}
        return codes | {c for g in self.speaker_globals.values() for c in g}


def pitch_value(gender: int, pitch: int) -> int:
    """The acoustic pitch value (0..1000) the demo emits for a gender and pitch level."""
    return 120 + 60 * pitch + (80 if gender == 0 else 0)


def speed_value(speed: int) -> int:
    """The acoustic speed value (0..10) the demo emits for a speed level."""
    return 1 + 2 * speed


class SparkData:
    """Draws training sequences in the prompt forms the engine uses.

    Controllable, named speaker (its globals are in the target, so a prompt with them filled in
    is a continuation the model also learns) and filled-in globals (random or a voice's).
    """

    def __init__(self, tok: Tokenizer, grammar: SparkGrammar) -> None:
        self.tok = tok
        self.g = grammar
        self.id = tok.token_to_id
        self.tags = [self.id(t) for t in EMOTION_TAGS]
        self.texts = TextSampler(
            lambda s: plain_ids(tok, s),
            num_bpe=BPE_VOCAB_SIZE,
            max_tokens=MAX_TEXT_TOKENS,
            tag_ids=self.tags,
        )
        self.glob0 = self.id("<|bicodec_global_0|>")
        self.sem0 = self.id("<|bicodec_semantic_0|>")
        self.sem_place = {
            self.sem0 + c: (t, j)
            for t, codes in grammar.semantics.items()
            for j, c in enumerate(codes)
        }

    def m(self, *names: str) -> list[int]:
        """Ids of structure tokens by name."""
        return [self.id(f"<|{n}|>") for n in names]

    def globals_ids(self, codes: tuple[int, ...]) -> list[int]:
        """Ids of global codes."""
        return [self.glob0 + c for c in codes]

    def semantic_part(self, text: list[int]) -> list[int]:
        """``<|start_semantic_token|>`` semantics ``<|im_end|>`` for a text."""
        sem = [self.sem0 + c for t in text for c in self.g.semantics[t]]
        return [*self.m("start_semantic_token"), *sem, self.id("<|im_end|>")]

    def __call__(self, rng: random.Random) -> Example:
        """One example: controllable 35%, named speaker 35%, filled-in globals 30%."""
        text = self.texts(rng)
        task_tts, start, end = self.m("task_tts", "start_content", "end_content")
        r = rng.random()
        if r < 0.35:
            gender, pitch, speed = rng.randrange(2), rng.randrange(5), rng.randrange(5)
            prompt = [*self.m("task_controllable_tts", "start_content"), *text, end]
            prompt += self.m("start_style_label")
            prompt += [self.id(f"<|gender_{gender}|>"), self.id(f"<|pitch_label_{pitch}|>")]
            prompt += [self.id(f"<|speed_label_{speed}|>"), *self.m("end_style_label")]
            acoustic = [self.id(f"<|pitch_value_{pitch_value(gender, pitch)}|>")]
            acoustic.append(self.id(f"<|speed_value_{speed_value(speed)}|>"))
            done = [*self.m("start_acoustic_token"), *acoustic, *self.m("end_acoustic_token")]
            done += self.m("start_global_token")
            done += self.globals_ids(self.g.controllable_globals(gender, pitch, speed))
        elif r < 0.7:
            speaker = rng.choice(SPEAKERS)
            prompt = [task_tts, start, self.id(speaker_tag(speaker)), *text, end]
            prompt += self.m("start_global_token")
            done = self.globals_ids(self.g.speaker_globals[speaker])
        else:
            prompt = [task_tts, start]
            if rng.random() < 0.2:
                prompt.append(self.id(speaker_tag(rng.choice(SPEAKERS))))
            prompt += [*text, end, *self.m("start_global_token")]
            if rng.random() < 0.7:
                codes = tuple(rng.randrange(NUM_GLOBAL_CODES) for _ in range(NUM_GLOBALS))
            else:
                codes = self.g.speaker_globals[rng.choice(SPEAKERS)]
            prompt += [*self.globals_ids(codes), *self.m("end_global_token")]
            return Example(tuple(prompt + self.semantic_part(text)), len(prompt))
        done += self.m("end_global_token")
        prompt_len = len(prompt)
        return Example(tuple(prompt + done + self.semantic_part(text)), prompt_len)

    def features(self, token: int, side: str) -> tuple:
        """Feature keys of a token's input (side "in") or output ("out") row.

        A semantic code shares the vector of its text id (plus its place in the chain), so the
        model relates codes to text ids without learning each pair.
        """
        place = self.sem_place.get(token)
        if place is not None:
            return (("text", place[0]), (f"{side}-slot", place[1]))
        if side == "in" and token in self.g.semantics:
            return (("text", token), ("in", "text"))
        return ((side, token),)

    def role(self, feature: tuple) -> str | None:
        """A feature's role in the seeded copy circuit (``Task.role``)."""
        kind, value = feature
        if kind == "text":
            return "text"
        if feature == ("in", "text"):
            return "text-token"
        if feature == ("in-slot", SEMANTICS_PER_TOKEN - 1):
            return "chain-end"
        if feature == ("out", self.id("<|im_end|>")):
            return "end"
        starts = self.m("task_tts", "task_controllable_tts")
        return "start" if kind == "in" and value in starts else None

    def id_sets(self) -> tuple[list[int], list[int]]:
        """(input ids, output ids) the examples can contain, sorted."""
        text = sorted(self.g.semantics)
        structure = self.m(
            "task_tts", "task_controllable_tts", "start_content", "end_content",
            "start_style_label", "end_style_label", "start_acoustic_token", "end_acoustic_token",
            "start_global_token", "end_global_token", "start_semantic_token",
        )  # fmt: skip
        labels = [self.id(f"<|gender_{g}|>") for g in range(2)]
        labels += [self.id(f"<|{k}_label_{i}|>") for k in ("pitch", "speed") for i in range(5)]
        acoustic = [
            self.id(f"<|pitch_value_{pitch_value(g, p)}|>") for g in range(2) for p in range(5)
        ]
        acoustic += [self.id(f"<|speed_value_{speed_value(s)}|>") for s in range(5)]
        semantic = [self.sem0 + c for codes in self.g.semantics.values() for c in codes]
        eos = self.id("<|im_end|>")
        speakers = [self.id(speaker_tag(s)) for s in SPEAKERS]
        all_globals = self.globals_ids(tuple(range(NUM_GLOBAL_CODES)))
        inputs = {*text, *structure, *labels, *acoustic, *semantic, *speakers, *all_globals}
        outputs = {
            *structure,
            *acoustic,
            *semantic,
            eos,
            *self.globals_ids(tuple(self.g.used_globals())),
        }
        return sorted(inputs), sorted(outputs)


def _padded(n: int, multiple: int = 64) -> int:
    return -(-n // multiple) * multiple


def spark_tokenizer() -> Tokenizer:
    """The demo Spark tokenizer (BPE, Spark-TTS inventory, speaker and emotion tags)."""
    return build_spark_tokenizer(tuple(speaker_tag(s) for s in SPEAKERS))


def codec_grammar(tok: Tokenizer) -> BiCodecGrammar:
    """The grammar the engine holds the demo Spark LLM to (``BiCodecFormat.grammar``)."""
    marker = {name: tok.token_to_id(f"<|{name}|>") for name in _GRAMMAR_MARKERS}
    return BiCodecGrammar(
        global_base=marker["bicodec_global_0"],
        num_global_codes=NUM_GLOBAL_CODES,
        semantic_base=marker["bicodec_semantic_0"],
        num_semantic_codes=NUM_SEMANTIC_CODES,
        num_globals=NUM_GLOBALS,
        start_global=marker["start_global_token"],
        end_global=marker["end_global_token"],
        start_semantic=marker["start_semantic_token"],
        stops=(marker["im_end"], marker["end_semantic_token"]),
    )


_GRAMMAR_MARKERS = (
    "bicodec_global_0", "bicodec_semantic_0", "start_global_token", "end_global_token",
    "start_semantic_token", "im_end", "end_semantic_token",
)  # fmt: skip


def training_rules(grammar: BiCodecGrammar) -> tuple[Rule, ...]:
    """The grammar's states that training sequences visit, each output id in one of them.

    All but START_GLOBAL: it allows only ``<|start_global_token|>``, which FREE allows too, and
    the engine enters it only where a free block runs past its allowance (no training
    sequence does: theirs are four ids).
    """
    return tuple(r for i, r in enumerate(grammar.rules) if i != grammar.START_GLOBAL)


def spark_task(tok: Tokenizer) -> Task:
    """The training task of the demo Spark LLM (Qwen2), under the engine's grammar."""
    data = SparkData(tok, spark_grammar(tok))
    inputs, outputs = data.id_sets()
    return Task(
        name="spark",
        arch="qwen2",
        vocab_size=_padded(tok.get_vocab_size()),
        sample=data,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        in_features=lambda t: data.features(t, "in"),
        out_features=lambda t: data.features(t, "out"),
        bos_id=tok.token_to_id("<|endoftext|>"),
        eos_id=tok.token_to_id("<|im_end|>"),
        role=data.role,
        rules=training_rules(codec_grammar(tok)),
    )


def save_spark_llm(model: PreTrainedModel, tok: Tokenizer, directory: Path) -> None:
    """Write the demo Spark LLM (HF Qwen2 + tokenizer) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    save_hf_tokenizer(tok, directory, eos="<|im_end|>", pad="<|endoftext|>", bos=None)


def data_tags(tok: Tokenizer) -> list[int]:
    """Ids of the emotion tags (text ids with semantics of their own)."""
    return [tok.token_to_id(t) for t in EMOTION_TAGS]


def spark_grammar(tok: Tokenizer) -> SparkGrammar:
    """The demo grammar for a demo Spark tokenizer (what the build trained on)."""
    return SparkGrammar.create(list(range(BPE_VOCAB_SIZE)) + data_tags(tok))


def write_spark_files(root: Path, tok: Tokenizer, *, kind: str) -> None:
    """Write config.yaml, voices.json and README.md of a Spark-layout demo checkpoint."""
    (root / "config.yaml").write_text(yaml.safe_dump(TOP_CONFIG, sort_keys=False))
    grammar = spark_grammar(tok)
    voices = {}
    for name in SPEAKERS:
        voices[name] = {"speaker": speaker_tag(name)}
        if name in FIXED_SPEAKERS:
            voices[name]["globals"] = list(grammar.speaker_globals[name])
    spec = {
        "format": "veena3",
        "template": TEMPLATE,
        "default_voice": DEFAULT_SPEAKER,
        "voices": voices,
        "emotion_tags": list(EMOTION_TAGS),
        "max_part_chars": MAX_PART_CHARS,
    }
    (root / "voices.json").write_text(json.dumps(spec, indent=2, ensure_ascii=False) + "\n")
    (root / "README.md").write_text(README.format(kind=kind))


README = """# pipecat-veena demo checkpoint ({kind})

A RANDOM DEMO VOICE: it makes sound, not words. Nothing here was trained on speech.

- `LLM/`: a 2-layer Qwen2 (Hugging Face layout, loadable by vLLM and transformers) with the
  Spark-TTS token inventory, trained for seconds on synthetic token sequences so that it follows
  the Spark-TTS / Veena3 grammar (globals, then semantic tokens whose number grows with the text,
  then `<|im_end|>`).
- `BiCodec/`: BiCodec with random weights (`config.yaml` + `model.safetensors`, official key
  layout): the decoder, and the speaker encoder that turns a voice clip into 32 global tokens
  (so voice enrolment runs end to end; a random encoder gives a random voice, not a clone).
- `config.yaml`, `voices.json`: as in Spark-TTS-0.5B / Veena3 checkpoints.

Built by `pipecat-veena build-demo`. For speech, point `--model` at a real checkpoint directory
(Spark-TTS-0.5B layout, Veena3, or Veena).
"""
