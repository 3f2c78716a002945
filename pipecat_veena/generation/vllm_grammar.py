"""vLLM logits processor that holds each request to its codec grammar (``generation.grammar``).

Loaded into vLLM's engine process by name (``VllmGenerator`` passes this class in
``logits_processors``); a request opts in with ``SamplingParams.extra_args["veena_grammar"]``
(a grammar's ``to_spec()``). Every grammar's rules are compiled once into rows of one boolean
table of shape (1 + rules, vocab), True where a rule forbids an id (row 0 forbids nothing: rows
of the batch without a grammar). At every step each batch row picks its state's table row and
one ``masked_fill_`` over the whole batch applies them all: one gather and one pass over the
logits, whatever the batch holds. States advance from each request's own output ids, read
right before sampling (vLLM keeps them current for custom processors).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from loguru import logger
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from pipecat_veena.generation.grammar import Grammar, State, grammar_from_spec

#: The ``SamplingParams.extra_args`` key a request puts its grammar spec under.
EXTRA_ARGS_KEY = "veena_grammar"


def _spec_of(params: Any) -> dict[str, Any] | None:
    extra = getattr(params, "extra_args", None) or {}
    return extra.get(EXTRA_ARGS_KEY)


@dataclass
class _Tracked:
    """One grammar request in the batch: its grammar key, output ids and state."""

    key: str
    grammar: Grammar
    output: list[int]
    state: State
    seen: int = 0

    def catch_up(self) -> None:
        out = self.output
        while self.seen < len(out) and out[self.seen] >= 0:  # -1: a placeholder not yet filled
            self.state = self.grammar.advance(self.state, out[self.seen])
            self.seen += 1


class GrammarLogitsProcessor(LogitsProcessor):
    """Masks every id the request's codec grammar forbids in its current state."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._device = device
        self._grammars: dict[str, Grammar] = {}  # by spec key, in compile order
        self._offsets: dict[str, int] = {}  # first table row of each grammar's rules
        self._table: torch.Tensor | None = None  # (1 + rules, vocab) bool: True = forbidden
        self._tracked: dict[int, _Tracked] = {}

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Reject a malformed grammar spec when the request is added (a clear 400, not a crash)."""
        spec = _spec_of(sampling_params)
        if spec is not None:
            grammar_from_spec(spec)

    def is_argmax_invariant(self) -> bool:
        """Masking changes the argmax: greedy requests need it too."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Track grammar requests as they join, leave and move within the batch."""
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._tracked.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            spec = _spec_of(params)
            if spec is None:
                self._tracked.pop(index, None)
                continue
            key = json.dumps(spec, sort_keys=True)
            grammar = self._grammars.get(key)
            if grammar is None:
                grammar = self._grammars[key] = grammar_from_spec(spec)
                self._table = None  # rebuilt with the new grammar's rules at the next step
                logger.trace(f"grammar compiled: {spec.get('kind')} ({len(self._grammars)} known)")
            self._tracked[index] = _Tracked(key, grammar, output, grammar.initial())
        for a, b, direction in batch_update.moved:
            first, second = self._tracked.pop(a, None), self._tracked.pop(b, None)
            if first is not None:
                self._tracked[b] = first
            if second is not None and direction == MoveDirectionality.SWAP:
                self._tracked[a] = second

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Set every id a row's grammar state forbids to -inf (rows without a grammar: none)."""
        if not self._tracked:
            return logits
        if self._table is None or self._table.shape[1] != logits.shape[1]:
            self._build_table(logits.shape[1])
        rows = [0] * logits.shape[0]
        for index, tracked in self._tracked.items():
            tracked.catch_up()
            if index < len(rows):
                rows[index] = self._offsets[tracked.key] + tracked.state[0]
        picked = self._table[torch.tensor(rows, device=self._table.device)]  # (batch, vocab)
        return logits.masked_fill_(picked, float("-inf"))

    def _build_table(self, vocab: int) -> None:
        tables, offset = [torch.zeros(1, vocab, dtype=torch.bool)], 1
        for key, grammar in self._grammars.items():
            self._offsets[key] = offset
            tables.append(_forbidden(grammar, vocab))
            offset += len(grammar.rules)
        self._table = torch.cat(tables).to(self._device)


def _forbidden(grammar: Grammar, vocab: int) -> torch.Tensor:
    """(rules, vocab) bool: True where a rule forbids an id."""
    rules = grammar.rules
    table = torch.ones((len(rules), vocab), dtype=torch.bool)
    for i, rule in enumerate(rules):
        row = table[i]
        if rule.invert:
            row.fill_(False)
        for lo, hi in rule.ranges:
            row[max(lo, 0) : min(hi, vocab)] = rule.invert
    return table
