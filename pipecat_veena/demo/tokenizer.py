"""Demo tokenizers: a small byte-level BPE plus the Spark-TTS or Veena/Orpheus token inventory.

Both share one BPE trained deterministically on ``CORPUS`` (byte-level, so any text encodes).
- Spark: the BPE, Qwen's three special tokens, then the Spark-TTS added tokens (codec, task,
  structure and style tokens), the demo's speaker tags and emotion tags. Ids differ from the
  real tokenizer's; the strings are the same, and the engine reads ids by string.
- Veena: the BPE and speaker tags at the bottom, filler tokens up to 128000, Llama's
  ``<|begin_of_text|>`` / ``<|end_of_text|>``, fillers up to 128256, then ``<custom_token_N>``
  at ``128256 + N`` exactly as in Orpheus / Veena.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.trainers import BpeTrainer

from pipecat_veena.demo.corpus import CORPUS

#: Size of the demo BPE (256 byte symbols plus merges).
BPE_VOCAB_SIZE = 384

SPARK_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SPARK_STRUCTURE = tuple(
    f"<|{name}|>"
    for name in (
        "task_tts task_controllable_tts start_content end_content start_style_label "
        "end_style_label start_acoustic_token end_acoustic_token start_global_token "
        "end_global_token start_semantic_token end_semantic_token"
    ).split()
)
NUM_GLOBAL_CODES = 4096
NUM_SEMANTIC_CODES = 8192
NUM_LEVELS = 5
NUM_PITCH_VALUES = 1001
NUM_SPEED_VALUES = 11
EMOTION_TAGS = ("<laugh>", "<sigh>", "<happy>", "<sad>")

#: Veena / Orpheus: ``<custom_token_N>`` sits at ``CUSTOM_BASE + N``.
CUSTOM_BASE = 128256
LLAMA_SPECIAL_BASE = 128000
SNAC_SLOTS = 7
SNAC_CODEBOOK = 4096
NUM_CUSTOM = 10 + SNAC_SLOTS * SNAC_CODEBOOK


def train_bpe() -> Tokenizer:
    """The demo BPE (NFC, byte-level, ``BPE_VOCAB_SIZE`` ids), trained on ``CORPUS``."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(CORPUS), trainer)
    if tok.get_vocab_size() != BPE_VOCAB_SIZE:
        raise RuntimeError(f"demo BPE has {tok.get_vocab_size()} ids, not {BPE_VOCAB_SIZE}")
    return tok


def spark_added_tokens(speaker_tags: tuple[str, ...]) -> list[str]:
    """Spark-TTS added tokens in id order (globals and semantics contiguous: the engine checks)."""
    tokens = [f"<|bicodec_global_{i}|>" for i in range(NUM_GLOBAL_CODES)]
    tokens += [f"<|bicodec_semantic_{i}|>" for i in range(NUM_SEMANTIC_CODES)]
    tokens += list(SPARK_STRUCTURE)
    tokens += ["<|gender_0|>", "<|gender_1|>"]
    tokens += [f"<|pitch_label_{i}|>" for i in range(NUM_LEVELS)]
    tokens += [f"<|speed_label_{i}|>" for i in range(NUM_LEVELS)]
    tokens += [f"<|pitch_value_{i}|>" for i in range(NUM_PITCH_VALUES)]
    tokens += [f"<|speed_value_{i}|>" for i in range(NUM_SPEED_VALUES)]
    return tokens + list(speaker_tags) + list(EMOTION_TAGS)


def build_spark_tokenizer(speaker_tags: tuple[str, ...]) -> Tokenizer:
    """The demo BPE with Qwen's special tokens and the Spark-TTS inventory added."""
    tok = train_bpe()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPARK_SPECIAL])
    added = spark_added_tokens(speaker_tags)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tok


def build_veena_tokenizer(speaker_tags: tuple[str, ...]) -> Tokenizer:
    """The demo BPE padded to the Llama-3 layout with Orpheus's custom tokens at exact ids."""
    base = json.loads(train_bpe().to_str())
    vocab: dict[str, int] = base["model"]["vocab"]
    llama = {LLAMA_SPECIAL_BASE: "<|begin_of_text|>", LLAMA_SPECIAL_BASE + 1: "<|end_of_text|>"}
    fixed = {**llama, **{BPE_VOCAB_SIZE + i: tag for i, tag in enumerate(speaker_tags)}}
    for i in range(BPE_VOCAB_SIZE, CUSTOM_BASE):
        # Fillers keep the ids of the real layout; no merge produces them, so text never does.
        vocab[fixed.get(i, f"<|filler_{i}|>")] = i
    for n in range(NUM_CUSTOM):
        vocab[f"<custom_token_{n}>"] = CUSTOM_BASE + n
    tok = Tokenizer.from_str(json.dumps(base))
    # Added tokens whose string is in the vocab keep that id.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in llama.values()])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in speaker_tags])
    custom = [f"<custom_token_{n}>" for n in range(NUM_CUSTOM)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in custom])
    for tag_id in (CUSTOM_BASE, CUSTOM_BASE + NUM_CUSTOM - 1):
        if tok.id_to_token(tag_id) != f"<custom_token_{tag_id - CUSTOM_BASE}>":
            raise RuntimeError(f"demo Veena tokenizer: id {tag_id} is {tok.id_to_token(tag_id)}")
    return tok


def plain_ids(tok: Tokenizer, text: str) -> list[int]:
    """Ids of ``text`` through the normalizer, pre-tokenizer and BPE only (no added tokens)."""
    text = tok.normalizer.normalize_str(text)
    pieces = tok.pre_tokenizer.pre_tokenize_str(text)
    return [t.id for piece, _ in pieces for t in tok.model.tokenize(piece)]


def save_hf_tokenizer(
    tok: Tokenizer, directory: Path, *, eos: str, pad: str, bos: str | None
) -> None:
    """Write ``tokenizer.json`` and the transformers files (AutoTokenizer loads the directory)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos,
        pad_token=pad,
        bos_token=bos,
        clean_up_tokenization_spaces=False,
    )
    hf.save_pretrained(str(directory))
