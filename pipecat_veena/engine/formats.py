"""Model families: what differs between BiCodec (Spark-TTS / Veena3) and SNAC (Veena / Orpheus).

A ``ModelFormat`` bundles, for one loaded checkpoint, the token inventory (read from its
tokenizer), the prompt builder, the stream parser, the voices and the sampling defaults. The
engine talks to this one interface and never branches on the family itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipecat_veena.engine.checkpoint import CheckpointLayout
from pipecat_veena.engine.prompts import SparkPrompts, TextEncoder, VeenaPrompts
from pipecat_veena.engine.tokens import BiCodecIds, BiCodecParser, SnacIds, SnacParser
from pipecat_veena.engine.voices import Voice, VoiceBook, VoicePrint, spark_voices, veena_voices
from pipecat_veena.errors import MalformedStreamError, TokenizerError
from pipecat_veena.generation import SamplingOptions
from pipecat_veena.generation.grammar import BiCodecGrammar, Grammar, SnacGrammar
from pipecat_veena.text import max_speech_seconds

#: Tokens the model may spend on markers and style tokens around the globals (acoustic block,
#: start/end markers) before the first semantic token.
_PREFIX_MARKER_ALLOWANCE = 16


def load_tokenizer(llm_dir: Path) -> Any:
    """The LLM's fast tokenizer (``tokenizers.Tokenizer``) from tokenizer.json."""
    from tokenizers import Tokenizer

    path = llm_dir / "tokenizer.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(llm_dir), use_fast=True).backend_tokenizer
    except Exception as e:
        raise TokenizerError(
            f"{llm_dir}: no tokenizer.json and no fast tokenizer could be built ({e}); "
            "save the tokenizer with save_pretrained() to get a tokenizer.json"
        ) from e


class ModelFormat:
    """Family-specific behaviour behind one interface (see the module docstring)."""

    #: "bicodec" or "snac".
    family: str
    voices: VoiceBook
    default_sampling: SamplingOptions

    prompts: SparkPrompts | VeenaPrompts

    def clean_text(self, text: str) -> str:
        """User text with every control string dropped (done before splitting it into parts)."""
        return self.prompts.clean(text)

    def prompt(self, text: str, voice: Voice, pinned: VoicePrint | None) -> list[int]:
        """Prompt ids for one part of an utterance."""
        raise NotImplementedError

    def parser(self, *, prefilled: bool) -> BiCodecParser | SnacParser:
        """A fresh parser for one generated part."""
        raise NotImplementedError

    def budget(self, text: str, *, prefilled: bool, tokens_per_second: float) -> tuple[int, int]:
        """(min_tokens, max_tokens) for a part: max is the runaway cap derived from the text."""
        raise NotImplementedError

    def voice_prefix_globals(self, prefix: Sequence[int]) -> tuple[int, ...]:
        """The globals of a generated voice prefix (only BiCodec voices have one)."""
        raise ValueError(f"{self.family} voices are speaker tags: there is no voice print to pin")

    def grammar(self, voice: Voice, *, prefilled: bool) -> Grammar:
        """The grammar a part's generated ids must follow, from where its prompt ends."""
        raise NotImplementedError

    def options(
        self,
        base: SamplingOptions,
        text: str,
        voice: Voice,
        *,
        prefilled: bool,
        rate: float,
        constrain: bool = True,
    ) -> SamplingOptions:
        """Per-part sampling options: the caller's, with stops, token budget and grammar.

        The grammar is set only when ``constrain`` is True; the voice's LoRA adapter, if any,
        rides along (``SamplingOptions.adapter``).
        """
        low, high = self.budget(text, prefilled=prefilled, tokens_per_second=rate)
        grammar = self.grammar(voice, prefilled=prefilled) if constrain else None
        return replace(
            base,
            min_tokens=low,
            max_tokens=high,
            stop_token_ids=self.stop_ids,
            grammar=grammar,
            adapter=voice.adapter,
        )

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a part."""
        raise NotImplementedError


class BiCodecFormat(ModelFormat):
    """Spark-TTS-0.5B and Veena3 (BiCodec semantic + global tokens)."""

    family = "bicodec"
    default_sampling = SamplingOptions(temperature=0.8, top_k=50, top_p=0.95)

    def __init__(self, layout: CheckpointLayout, tokenizer: Any, num_globals: int) -> None:
        self.ids = BiCodecIds.from_lookup(tokenizer.token_to_id)
        self.num_globals = num_globals
        self.voices = spark_voices(layout.root, num_globals)
        self.encoder = TextEncoder(tokenizer, self.voices.emotion_tags)
        self.prompts = SparkPrompts(self.ids, self.encoder, self.voices.template)

    def prompt(self, text: str, voice: Voice, pinned: VoicePrint | None) -> list[int]:
        """Prompt ids; a pinned voice's prefix is appended so only semantics follow."""
        return self.prompts.build(text, voice, pinned.prefix if pinned else ())

    def parser(self, *, prefilled: bool) -> BiCodecParser:
        """A parser expecting the voice prefix unless it is prefilled."""
        return BiCodecParser(self.ids, self.num_globals, prefilled=prefilled)

    def voice_prefix_globals(self, prefix: Sequence[int]) -> tuple[int, ...]:
        """The globals of a generated voice prefix; ValueError when it is not one.

        Raises:
            ValueError: ``prefix`` is not [acoustic block] start_global, the globals,
                end_global of this tokenizer (e.g. it came from another model).
        """
        parser = self.parser(prefilled=False)
        try:
            extra = parser.feed(prefix)
        except MalformedStreamError as e:
            raise ValueError(f"not a voice prefix of this model: {e}") from e
        if extra or not parser.voice_ready or list(parser.prefix) != list(prefix):
            raise ValueError("not a voice prefix of this model: it must end with its globals")
        return tuple(parser.globals)

    def grammar(self, voice: Voice, *, prefilled: bool) -> BiCodecGrammar:
        """The BiCodec grammar from where the prompt leaves the model.

        Semantics only after a filled-in voice; globals first after a template prompt; a free
        acoustic block first after a controllable prompt.
        """
        ids = self.ids
        start = "semantic" if prefilled else "globals" if voice.speaker is not None else "free"
        return BiCodecGrammar(
            global_base=ids.global_base,
            num_global_codes=ids.num_global_codes,
            semantic_base=ids.semantic_base,
            num_semantic_codes=ids.num_semantic_codes,
            num_globals=self.num_globals,
            start_global=ids.marker("start_global_token"),
            end_global=ids.marker("end_global_token"),
            start_semantic=ids.marker("start_semantic_token"),
            stops=self.stop_ids,
            # the free block plus the three markers fit in the prefix allowance of the budget
            free_allowance=_PREFIX_MARKER_ALLOWANCE - 3,
            start=start,
        )

    def budget(self, text: str, *, prefilled: bool, tokens_per_second: float) -> tuple[int, int]:
        """Room for the voice prefix (unless prefilled) plus the runaway cap of semantics."""
        prefix = 0 if prefilled else self.num_globals + _PREFIX_MARKER_ALLOWANCE
        speech = math.ceil(max_speech_seconds(text) * tokens_per_second)
        return (self.num_globals + 3 if not prefilled else 1), prefix + speech

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """``<|im_end|>`` (and ``<|end_semantic_token|>`` when the tokenizer has it)."""
        return self.prompts.stop_ids


class SnacFormat(ModelFormat):
    """Veena / Orpheus (7-token SNAC frames at 24 kHz)."""

    family = "snac"
    # Veena's published settings (model card): T 0.4, top_p 0.9, repetition penalty 1.05.
    default_sampling = SamplingOptions(temperature=0.4, top_k=0, top_p=0.9, repetition_penalty=1.05)

    def __init__(self, layout: CheckpointLayout, tokenizer: Any, slots: int = 7) -> None:
        self.ids = SnacIds.from_lookup(tokenizer.token_to_id, slots=slots)
        self.voices = veena_voices(layout.root)
        self.encoder = TextEncoder(tokenizer, self.voices.emotion_tags)
        self.prompts = VeenaPrompts(self.ids, self.encoder)

    def prompt(self, text: str, voice: Voice, pinned: VoicePrint | None) -> list[int]:
        """Prompt ids (SNAC voices are speaker tags: nothing to pin)."""
        return self.prompts.build(text, voice)

    def parser(self, *, prefilled: bool) -> SnacParser:
        """A parser of slot-ordered SNAC codes."""
        return SnacParser(self.ids)

    def grammar(self, voice: Voice, *, prefilled: bool) -> SnacGrammar:
        """Whole frames in slot order (the prompt ends with START_OF_SPEECH)."""
        ids = self.ids
        return SnacGrammar(ids.audio_base, ids.codebook_size, ids.slots, self.stop_ids)

    def budget(self, text: str, *, prefilled: bool, tokens_per_second: float) -> tuple[int, int]:
        """At least one frame; at most the runaway cap, in whole frames."""
        slots = self.ids.slots
        speech = math.ceil(max_speech_seconds(text) * tokens_per_second / slots) * slots
        return slots, speech + 1

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """END_OF_SPEECH and END_OF_AI."""
        return self.prompts.stop_ids


def load_format(layout: CheckpointLayout, tokenizer: Any, condition_size: int) -> ModelFormat:
    """The format of a checkpoint, its ids checked against its tokenizer."""
    if layout.family == "bicodec":
        return BiCodecFormat(layout, tokenizer, condition_size)
    return SnacFormat(layout, tokenizer)
