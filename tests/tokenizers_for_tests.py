"""Small real tokenizers (``tokenizers`` BPE) with the Spark and Veena inventories."""

from __future__ import annotations

from functools import cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = [
    "Hello world, this is a test of the speech system.",
    "नमस्ते दुनिया, यह एक परीक्षण है। Welcome to the demo!",
    "Aaj ka weather बहुत अच्छा है, let's go out.",
]

SPARK_MARKERS = [
    "<|task_tts|>", "<|task_controllable_tts|>", "<|start_content|>", "<|end_content|>",
    "<|start_style_label|>", "<|end_style_label|>", "<|start_acoustic_token|>",
    "<|end_acoustic_token|>", "<|start_global_token|>", "<|end_global_token|>",
    "<|start_semantic_token|>", "<|end_semantic_token|>", "<|gender_0|>", "<|gender_1|>",
    *[f"<|pitch_label_{i}|>" for i in range(5)], *[f"<|speed_label_{i}|>" for i in range(5)],
]  # fmt: skip


def _base(extra_special: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=extra_special,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


@cache
def spark_tokenizer_json() -> str:
    """A Spark-TTS-like tokenizer (as JSON) with the whole BiCodec inventory."""
    tok = _base(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens([f"<|bicodec_global_{i}|>" for i in range(4096)])
    tok.add_tokens([f"<|bicodec_semantic_{i}|>" for i in range(8192)])
    tok.add_tokens(SPARK_MARKERS + ["<|speaker_nilay|>", "<laugh>"])
    return tok.to_str()


@cache
def veena_tokenizer_json() -> str:
    """A Veena-like tokenizer (as JSON): ``<custom_token_N>`` after a small BPE."""
    tok = _base(["<|begin_of_text|>", "<|end_of_text|>"])
    tok.add_tokens([f"<custom_token_{i}>" for i in range(10 + 7 * 4096)])
    return tok.to_str()


def spark_tokenizer() -> Tokenizer:
    """A fresh Spark-like tokenizer."""
    return Tokenizer.from_str(spark_tokenizer_json())


def veena_tokenizer() -> Tokenizer:
    """A fresh Veena-like tokenizer."""
    return Tokenizer.from_str(veena_tokenizer_json())
