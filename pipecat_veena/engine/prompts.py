"""Prompt formats: text and a voice in, prompt token ids out.

User text is data, never control: it usually comes from another LLM that a caller may steer.
Exact copies of the tokenizer's added tokens (``<|im_end|>``, ``<|bicodec_global_7|>``,
``<custom_token_4>`` ...) are dropped from it, and what remains is encoded by the BPE model alone,
so no id of the text can ever be a control or codec token. Only the checkpoint's declared inline
emotion tags (e.g. ``<laugh>``) pass through as tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipecat_veena.engine.tokens import BiCodecIds, SnacIds
from pipecat_veena.engine.voices import Voice

_TAG_CANDIDATE = re.compile(r"<\|?[^<>|\s]{1,64}\|?>")
_SNAC_SPEAKER = re.compile(r"<spk_[^<>]{0,40}>")
_SPACES = re.compile(r"\s+")


class TextEncoder:
    """Encodes control strings with the full tokenizer and user text with the BPE model only.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (the checkpoint's tokenizer.json).
        emotion_tags: inline tags allowed through from user text as tokens.
    """

    def __init__(self, tokenizer, emotion_tags: Sequence[str] = ()) -> None:
        self._tok = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        self.added_ids = frozenset(added)
        self._added_strings = frozenset(t.content for t in added.values())
        self.emotion_tags = tuple(t for t in emotion_tags if tokenizer.token_to_id(t) is not None)
        self._tag_ids = {t: tokenizer.token_to_id(t) for t in self.emotion_tags}
        self._tag_split = (
            re.compile("(" + "|".join(re.escape(t) for t in self.emotion_tags) + ")")
            if self.emotion_tags
            else None
        )

    def token_id(self, token: str) -> int | None:
        """Id of a token string, or None."""
        return self._tok.token_to_id(token)

    def control(self, text: str) -> list[int]:
        """Encode a trusted control string (added tokens allowed, no BOS/EOS added)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def plain(self, text: str) -> list[int]:
        """Encode text with the normalizer, pre-tokenizer and BPE model only (no added tokens)."""
        tok = self._tok
        if tok.normalizer is not None:
            text = tok.normalizer.normalize_str(text)
        pieces = tok.pre_tokenizer.pre_tokenize_str(text) if tok.pre_tokenizer else [(text, None)]
        return [t.id for piece, _ in pieces for t in tok.model.tokenize(piece)]

    def sanitize(self, text: str) -> str:
        """Drop exact copies of added tokens (except allowed tags) and fold white space."""

        def drop(match: re.Match[str]) -> str:
            s = match.group(0)
            keep = s in self._tag_ids or s not in self._added_strings
            return s if keep else " "

        return _SPACES.sub(" ", _TAG_CANDIDATE.sub(drop, text)).strip()

    def user_text(self, text: str, *, lead: str = "") -> list[int]:
        """Encode user text as data: sanitized, allowed tags as tokens, the rest plain.

        Args:
            text: the text to say.
            lead: trusted characters put before the sanitized text (e.g. the space that
                separates it from a speaker tag, so BPE merges it as in training).
        """
        text = lead + self.sanitize(text)
        if self._tag_split is None:
            return self.plain(text)
        ids: list[int] = []
        for piece in self._tag_split.split(text):
            if piece in self._tag_ids:
                ids.append(self._tag_ids[piece])
            elif piece:
                ids.extend(self.plain(piece))
        return ids


class SparkPrompts:
    """Spark-TTS / Veena3 prompts (BiCodec): controllable, named speaker (template), clone.

    Args:
        ids: the token inventory.
        encoder: the text encoder.
        template: Veena3 template with ``{speaker}`` and ``{text}``, ending with
            ``<|start_global_token|>`` (from the checkpoint's voices.json), or None.
    """

    def __init__(self, ids: BiCodecIds, encoder: TextEncoder, template: str | None = None) -> None:
        self.ids = ids
        self.encoder = encoder
        if template is not None and (
            "{text}" not in template or not template.endswith("<|start_global_token|>")
        ):
            raise ValueError(
                "voices.json template must contain {text} and end with <|start_global_token|>, "
                f"got {template!r}"
            )
        self.template = template

    def clean(self, text: str) -> str:
        """User text without control strings (see ``TextEncoder.sanitize``)."""
        return self.encoder.sanitize(text)

    def build(self, text: str, voice: Voice, prefix: Sequence[int] = ()) -> list[int]:
        """Prompt ids for one part; ``prefix`` (a captured voice prefix) is appended when given.

        A voice with fixed globals uses the clone form; a prefix from an earlier part makes the
        model continue with the semantic tokens only, in the same voice. Both end with
        ``<|start_semantic_token|>``, which the model would otherwise spend a step on. An
        enrolled voice with a transcript uses Spark-TTS's clone-with-transcript form: the
        reference transcript right before the text (no separator, as Spark-TTS joins them) and
        the reference clip's semantic tokens after ``<|start_semantic_token|>``, which the model
        continues with the text's.
        """
        enc = self.encoder
        if voice.globals is not None:
            spoken = text if voice.transcript is None else voice.transcript + text
            head = enc.control("<|task_tts|><|start_content|>")
            tail = enc.control("<|end_content|><|start_global_token|>")
            filled = [*self.ids.global_ids(voice.globals), self.ids.marker("end_global_token")]
            reference = self.ids.semantic_ids(voice.semantic or ())
            return [*head, *enc.user_text(spoken), *tail, *filled, *self._semantic_start,
                    *reference]  # fmt: skip
        body = enc.user_text(text)
        if voice.speaker is not None:
            if self.template is None:
                raise ValueError(f"voice {voice.name!r} needs a template (voices.json)")
            before, after = self.template.split("{text}", 1)
            head = enc.control(before.replace("{speaker}", voice.speaker))
            tail = enc.control(after.replace("{speaker}", voice.speaker))
            return [*head, *body, *tail, *self._after(prefix)]
        head = enc.control("<|task_controllable_tts|><|start_content|>")
        labels = (
            f"<|end_content|><|start_style_label|><|gender_{voice.gender}|>"
            f"<|pitch_label_{voice.pitch}|><|speed_label_{voice.speed}|><|end_style_label|>"
        )
        return [*head, *body, *enc.control(labels), *self._after(prefix)]

    @property
    def _semantic_start(self) -> list[int]:
        return [self.ids.marker("start_semantic_token")]

    def _after(self, prefix: Sequence[int]) -> list[int]:
        """A voice prefix plus the semantic start marker (the first token generated is speech)."""
        return [*prefix, *self._semantic_start] if prefix else []

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end generation."""
        end_semantic = self.ids.markers.get("end_semantic_token")
        return (self.ids.eos,) if end_semantic is None else (self.ids.eos, end_semantic)


class VeenaPrompts:
    """Veena / Orpheus prompts (SNAC): ``[SOH] "<spk_x> text" [EOH, SOA, SOS]``.

    Args:
        ids: the token inventory.
        encoder: the text encoder.
    """

    def __init__(self, ids: SnacIds, encoder: TextEncoder) -> None:
        self.ids = ids
        self.encoder = encoder

    def clean(self, text: str) -> str:
        """User text without control strings; a speaker tag in it would switch the voice."""
        return self.encoder.sanitize(_SNAC_SPEAKER.sub(" ", text))

    def build(self, text: str, voice: Voice, prefix: Sequence[int] = ()) -> list[int]:
        """Prompt ids for one part (``prefix`` is unused: SNAC has no voice prefix)."""
        ids = self.ids
        text = self.clean(text)
        speaker = self.encoder.control(f"<spk_{voice.speaker}>")
        body = self.encoder.user_text(text, lead=" ")
        return [ids.start_of_human, *speaker, *body, ids.end_of_human, ids.start_of_ai,
                ids.start_of_speech]  # fmt: skip

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end generation."""
        return self.ids.stop_ids
