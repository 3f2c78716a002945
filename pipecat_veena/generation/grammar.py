"""Codec grammars as token-level state machines: which ids the LLM may sample next.

Pure integer logic (no torch, no vLLM). A backend that supports it (vLLM, through
``generation/vllm_grammar.py``) masks every other id at each step, so the token stream of ANY
model, however badly trained or however wildly sampled, follows the codec grammar: a BiCodec
stream is [free acoustic block] ``<|start_global_token|>`` exactly 32 globals
``<|end_global_token|>`` ``<|start_semantic_token|>`` semantics, then a stop; a SNAC stream is
whole 7-token frames in slot order, then a stop. The parsers in ``tokens.py`` still check every
stream (a backend without grammar support, a remote server), but with the mask on they never
find a fault.

A grammar is a list of *rules* (the allowed ids of one state, as id ranges) and a transition
function over a small state: ``(rule index, counter)``. It travels to the backend as a plain
dict (``to_spec``) and is rebuilt there (``grammar_from_spec``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: An allowed id set: half-open ranges [lo, hi); ``invert`` allows everything EXCEPT them.
Ranges = tuple[tuple[int, int], ...]

#: A grammar state: (rule index, counter within the rule).
State = tuple[int, int]


@dataclass(frozen=True)
class Rule:
    """The ids allowed in one state.

    Attributes:
        ranges: half-open id ranges [lo, hi).
        invert: when True the ranges are the FORBIDDEN ids and everything else is allowed.
    """

    ranges: Ranges
    invert: bool = False

    def allows(self, token: int) -> bool:
        """Whether ``token`` may be sampled in this state."""
        inside = any(lo <= token < hi for lo, hi in self.ranges)
        return inside != self.invert


def _one(token: int) -> tuple[int, int]:
    return (token, token + 1)


@dataclass(frozen=True)
class BiCodecGrammar:
    """The Spark-TTS / Veena3 stream grammar (see the module docstring).

    Args:
        global_base: id of ``<|bicodec_global_0|>``.
        num_global_codes: global codebook size (4096).
        semantic_base: id of ``<|bicodec_semantic_0|>``.
        num_semantic_codes: semantic codebook size (8192).
        num_globals: global tokens per voice (32).
        start_global, end_global, start_semantic: the structure markers.
        stops: ids that end a stream (``<|im_end|>``, ``<|end_semantic_token|>``).
        free_allowance: most tokens of the acoustic block before ``<|start_global_token|>`` is
            forced (controllable prompts; the model writes pitch and speed values there).
        start: where the prompt leaves the model: "free" (controllable prompts), "globals"
            (the prompt ends with ``<|start_global_token|>``) or "semantic" (the prompt ends
            with ``<|start_semantic_token|>``: a pinned or given voice).
    """

    global_base: int
    num_global_codes: int
    semantic_base: int
    num_semantic_codes: int
    num_globals: int
    start_global: int
    end_global: int
    start_semantic: int
    stops: tuple[int, ...]
    free_allowance: int = 16
    start: str = "free"

    # Rule indices.
    FREE, START_GLOBAL, GLOBAL, END_GLOBAL, START_SEMANTIC, SEMANTIC = range(6)

    def __post_init__(self) -> None:
        if self.start not in ("free", "globals", "semantic"):
            raise ValueError(f"start must be free, globals or semantic, got {self.start!r}")

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The allowed ids of each rule, indexed by the rule constants."""
        codes = (
            (self.global_base, self.global_base + self.num_global_codes),
            (self.semantic_base, self.semantic_base + self.num_semantic_codes),
        )
        # The free block may end with <|start_global_token|>, never skip past it.
        closed = (self.end_global, self.start_semantic, *self.stops)
        return (
            Rule((*codes, *map(_one, closed)), invert=True),  # FREE
            Rule((_one(self.start_global),)),  # START_GLOBAL
            Rule((codes[0],)),  # GLOBAL
            Rule((_one(self.end_global),)),  # END_GLOBAL
            Rule((_one(self.start_semantic),)),  # START_SEMANTIC
            Rule((codes[1], *map(_one, self.stops))),  # SEMANTIC
        )

    def initial(self) -> State:
        """The state right after the prompt."""
        rule = {"free": self.FREE, "globals": self.GLOBAL, "semantic": self.SEMANTIC}
        return (rule[self.start], 0)

    def advance(self, state: State, token: int) -> State:
        """The state after ``token`` was generated in ``state``."""
        rule, count = state
        if rule == self.FREE:
            if token == self.start_global:
                return (self.GLOBAL, 0)
            nxt = count + 1
            return (self.START_GLOBAL, 0) if nxt >= self.free_allowance - 1 else (self.FREE, nxt)
        if rule == self.START_GLOBAL:
            return (self.GLOBAL, 0)
        if rule == self.GLOBAL:
            nxt = count + 1
            return (self.END_GLOBAL, 0) if nxt >= self.num_globals else (self.GLOBAL, nxt)
        if rule == self.END_GLOBAL:
            return (self.START_SEMANTIC, 0)
        return (self.SEMANTIC, 0)

    def to_spec(self) -> dict[str, Any]:
        """A plain dict that ``grammar_from_spec`` turns back into this grammar."""
        return {"kind": "bicodec", **{k: getattr(self, k) for k in self.__dataclass_fields__}}


@dataclass(frozen=True)
class SnacGrammar:
    """The Veena / Orpheus stream grammar: whole frames of ``slots`` codes in slot order.

    Args:
        audio_base: id of code 0 of slot 0.
        codebook_size: codes per slot (4096).
        slots: codes per frame (7).
        stops: ids that end a stream; allowed only between frames.
    """

    audio_base: int
    codebook_size: int
    slots: int
    stops: tuple[int, ...]

    @property
    def rules(self) -> tuple[Rule, ...]:
        """Rule j allows the codes of slot j (and, for slot 0, the stops)."""
        rules = []
        for slot in range(self.slots):
            lo = self.audio_base + slot * self.codebook_size
            extra = tuple(map(_one, self.stops)) if slot == 0 else ()
            rules.append(Rule(((lo, lo + self.codebook_size), *extra)))
        return tuple(rules)

    def initial(self) -> State:
        """Slot 0: the prompt ends with START_OF_SPEECH."""
        return (0, 0)

    def advance(self, state: State, token: int) -> State:
        """The next slot after a code (a stop ends the request: the state no longer matters)."""
        return ((state[0] + 1) % self.slots, 0)

    def to_spec(self) -> dict[str, Any]:
        """A plain dict that ``grammar_from_spec`` turns back into this grammar."""
        return {"kind": "snac", **{k: getattr(self, k) for k in self.__dataclass_fields__}}


Grammar = BiCodecGrammar | SnacGrammar


def grammar_from_spec(spec: dict[str, Any]) -> Grammar:
    """Rebuild a grammar from ``to_spec()`` output (lists become tuples).

    Raises:
        ValueError: an unknown kind or missing fields.
    """
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items() if k != "kind"}
    kinds = {"bicodec": BiCodecGrammar, "snac": SnacGrammar}
    if spec.get("kind") not in kinds:
        raise ValueError(f"unknown grammar kind {spec.get('kind')!r}; expected bicodec or snac")
    try:
        return kinds[spec["kind"]](**fields)
    except TypeError as e:
        raise ValueError(f"bad {spec['kind']} grammar spec: {e}") from e
