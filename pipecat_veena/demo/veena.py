"""The Veena-layout demo: its token grammar, training data and checkpoint files.

Prompt (as in Veena): ``[SOH] <spk_x> " text" [EOH, SOA, SOS]``. The demo LLM answers with one
whole 7-token SNAC frame per text id (slot ``j`` code ``c`` is id ``128266 + j * 4096 + c``), in
slot order, then END_OF_SPEECH. Frame codes are a fixed function of the text id; slot 0's also
depends on the speaker, so each speaker has its own code distribution (its own "voice").
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from pipecat_veena.demo.corpus import MAX_PART_CHARS, TextSampler
from pipecat_veena.demo.tokenizer import (
    BPE_VOCAB_SIZE,
    CUSTOM_BASE,
    LLAMA_SPECIAL_BASE,
    SNAC_CODEBOOK,
    SNAC_SLOTS,
    build_veena_tokenizer,
    plain_ids,
    save_hf_tokenizer,
)
from pipecat_veena.demo.train import Example, Task
from pipecat_veena.generation.grammar import SnacGrammar

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SPEAKERS = ("kavya", "agastya", "maitri", "vinaya")
START_OF_SPEECH = CUSTOM_BASE + 1
END_OF_SPEECH = CUSTOM_BASE + 2
START_OF_HUMAN = CUSTOM_BASE + 3
END_OF_HUMAN = CUSTOM_BASE + 4
START_OF_AI = CUSTOM_BASE + 5
END_OF_AI = CUSTOM_BASE + 6
AUDIO_BASE = CUSTOM_BASE + 10
#: The model's vocabulary (Orpheus pads the tokenizer's 156938 ids to 156940).
VOCAB_SIZE = 156940
MAX_TEXT_TOKENS = 72
SEED = 4321


def speaker_tag(name: str) -> str:
    """The speaker tag of the Veena prompt."""
    return f"<spk_{name}>"


class VeenaData:
    """Token maps (text id -> frame codes per speaker) and the training sequences."""

    def __init__(self, tok: Tokenizer, seed: int = SEED) -> None:
        self.tok = tok
        rng = random.Random(seed)
        n = BPE_VOCAB_SIZE
        slot0 = rng.sample(range(SNAC_CODEBOOK), n * len(SPEAKERS))
        rest = [rng.sample(range(SNAC_CODEBOOK), n) for _ in range(SNAC_SLOTS - 1)]
        self.frames = {
            s: {x: (slot0[k * n + x], *(codes[x] for codes in rest)) for x in range(n)}
            for k, s in enumerate(SPEAKERS)
        }
        self.speaker_ids = {s: tok.token_to_id(speaker_tag(s)) for s in SPEAKERS}
        self.speaker_names = {i: s for s, i in self.speaker_ids.items()}
        self.code_place = {
            AUDIO_BASE + j * SNAC_CODEBOOK + c: (s if j == 0 else None, x, j)
            for s, table in self.frames.items()
            for x, codes in table.items()
            for j, c in enumerate(codes)
        }
        self.texts = TextSampler(
            lambda s: plain_ids(tok, s), num_bpe=n, max_tokens=MAX_TEXT_TOKENS, lead=" "
        )

    def features(self, token: int) -> tuple:
        """Feature keys of a token's row: a frame code shares its text id's vector."""
        place = self.code_place.get(token)
        if place is not None:
            speaker, text, slot = place
            return (("text", text), ("slot", slot)) + ((("speaker", speaker),) if slot == 0 else ())
        if token < BPE_VOCAB_SIZE:
            return (("text", token), ("kind", "text"))
        if token in self.speaker_names:  # a speaker tag shares its codes' speaker vector
            return (("id", token), ("speaker", self.speaker_names[token]))
        return (("id", token),)

    def role(self, feature: tuple) -> str | None:
        """A feature's role in the seeded copy circuit (``Task.role``)."""
        kind, value = feature
        if kind in ("text", "speaker"):
            return kind
        if kind == "id" and value in self.speaker_names:
            return "speaker-tag"
        if feature == ("id", END_OF_SPEECH):
            return "end"
        if feature == ("kind", "text"):
            return "text-token"
        if feature == ("slot", SNAC_SLOTS - 1):
            return "chain-end"
        return "start" if feature == ("id", START_OF_HUMAN) else None

    def frame_ids(self, speaker: str, text: list[int]) -> list[int]:
        """The SNAC frame ids for a text, slot by slot."""
        table = self.frames[speaker]
        step = SNAC_CODEBOOK
        return [AUDIO_BASE + j * step + c for x in text for j, c in enumerate(table[x])]

    def prompt(self, speaker: str, text: list[int]) -> list[int]:
        """The Veena prompt ids for a speaker and text ids."""
        head = [START_OF_HUMAN, self.speaker_ids[speaker]]
        return [*head, *text, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]

    def __call__(self, rng: random.Random) -> Example:
        """One example: a random speaker and text."""
        speaker = rng.choice(SPEAKERS)
        text = self.texts(rng)
        prompt = self.prompt(speaker, text)
        return Example(tuple(prompt + self.frame_ids(speaker, text) + [END_OF_SPEECH]), len(prompt))

    def id_set(self) -> list[int]:
        """Every id the examples contain (the tied model's compact vocabulary), sorted."""
        ids = set(range(BPE_VOCAB_SIZE)) | set(self.speaker_ids.values())
        ids |= {START_OF_HUMAN, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH, END_OF_SPEECH}
        for speaker in SPEAKERS:
            ids |= set(self.frame_ids(speaker, list(range(BPE_VOCAB_SIZE))))
        return sorted(ids)


def snac_grammar() -> SnacGrammar:
    """The grammar the engine holds the demo Veena LLM to (whole frames, then a stop)."""
    return SnacGrammar(AUDIO_BASE, SNAC_CODEBOOK, SNAC_SLOTS, (END_OF_SPEECH, END_OF_AI))


def veena_tokenizer() -> Tokenizer:
    """The demo Veena tokenizer (BPE, speaker tags, fillers, Orpheus custom tokens)."""
    return build_veena_tokenizer(tuple(speaker_tag(s) for s in SPEAKERS))


def veena_task(tok: Tokenizer) -> Task:
    """The training task of the demo Veena LLM (Llama, tied embeddings).

    Trained under the SNAC grammar: a code competes with the codes of its slot only (and, at a
    frame's start, the stops), a seventh of the output rows per target.
    """
    data = VeenaData(tok)
    ids = tuple(data.id_set())
    return Task(
        name="veena",
        arch="llama",
        vocab_size=VOCAB_SIZE,
        sample=data,
        inputs=ids,
        outputs=ids,
        in_features=data.features,
        out_features=data.features,
        tied=True,
        bos_id=LLAMA_SPECIAL_BASE,
        eos_id=END_OF_SPEECH,
        role=data.role,
        rules=snac_grammar().rules,
    )


def save_veena_llm(model: PreTrainedModel, tok: Tokenizer, directory: Path) -> None:
    """Write the demo Veena LLM (HF Llama + tokenizer) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    save_hf_tokenizer(
        tok, directory, eos="<custom_token_2>", pad="<|end_of_text|>", bos="<|begin_of_text|>"
    )


def write_veena_files(root: Path, *, seed: int) -> None:
    """Write the random SNAC 24 kHz codec (``snac_24khz/``) and README.md."""
    from pipecat_veena.codecs.snac import write_random_checkpoint

    write_random_checkpoint(root / "snac_24khz", seed=seed)
    voices = {
        "format": "veena",
        "default_voice": SPEAKERS[0],
        "voices": {name: {"speaker": name} for name in SPEAKERS},
        "max_part_chars": MAX_PART_CHARS,
    }
    (root / "voices.json").write_text(json.dumps(voices, indent=2) + "\n")
    (root / "README.md").write_text(README)


README = """# pipecat-veena demo checkpoint (veena)

A RANDOM DEMO VOICE: it makes sound, not words. Nothing here was trained on speech.

- The LLM (Hugging Face layout at this directory's root, loadable by vLLM and transformers): a
  2-layer Llama with the Veena / Orpheus token ids (`<custom_token_N>` = id 128256 + N; SNAC code
  `c` of slot `j` = id 128266 + j * 4096 + c), trained for seconds on synthetic token sequences so
  that it answers a Veena prompt with whole 7-token SNAC frames and then END_OF_SPEECH (128258).
  Speakers: kavya (default), agastya, maitri, vinaya.
- `snac_24khz/`: the SNAC 24 kHz codec with random weights (`config.json` + `pytorch_model.bin`).

Built by `pipecat-veena build-demo`. For speech, point `--model` at a real checkpoint directory
(Spark-TTS-0.5B layout, Veena3, or Veena).
"""
