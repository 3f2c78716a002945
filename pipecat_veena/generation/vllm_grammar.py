"""vLLM logits processor that holds each request to its codec grammar (``pipecat_veena.grammar``).

Loaded into vLLM's engine process by name (``VllmGenerator`` passes this class in
``logits_processors``); a request opts in with ``SamplingParams.extra_args["veena_grammar"]``
(a grammar's ``to_spec()``). Each grammar is compiled once into an additive bias table of shape
(rules, vocab) holding 0 for allowed ids and -inf for the rest; at every step each grammar
request's row gets the bias row of its current state in one indexed add per grammar, so the
cost does not grow with the vocabulary on the Python side. States advance from the request's
own output ids, read right before sampling (vLLM keeps them current for custom processors).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from loguru import logger
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from pipecat_veena.grammar import Grammar, State, grammar_from_spec

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


@dataclass
class _Compiled:
    grammar: Grammar
    bias: torch.Tensor | None = None  # (rules, vocab), built on the first apply
    rows: list[int] = field(default_factory=list)
    rules: list[int] = field(default_factory=list)


class GrammarLogitsProcessor(LogitsProcessor):
    """Masks every id the request's codec grammar forbids in its current state."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._device = device
        self._compiled: dict[str, _Compiled] = {}
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
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compiled[key] = _Compiled(grammar_from_spec(spec))
                logger.trace(f"grammar compiled: {spec.get('kind')} ({len(self._compiled)} known)")
            grammar = compiled.grammar
            self._tracked[index] = _Tracked(key, grammar, output, grammar.initial())
        for a, b, direction in batch_update.moved:
            first, second = self._tracked.pop(a, None), self._tracked.pop(b, None)
            if first is not None:
                self._tracked[b] = first
            if second is not None and direction == MoveDirectionality.SWAP:
                self._tracked[a] = second

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Add each grammar request's bias row (0 allowed, -inf forbidden) to its logits row."""
        if not self._tracked:
            return logits
        for compiled in self._compiled.values():
            compiled.rows.clear()
            compiled.rules.clear()
        for index, tracked in self._tracked.items():
            tracked.catch_up()
            compiled = self._compiled[tracked.key]
            compiled.rows.append(index)
            compiled.rules.append(tracked.state[0])
        for compiled in self._compiled.values():
            if not compiled.rows:
                continue
            if compiled.bias is None or compiled.bias.shape[1] != logits.shape[1]:
                compiled.bias = _bias_table(compiled.grammar, logits.shape[1], logits.dtype)
                compiled.bias = compiled.bias.to(self._device)
            rows = torch.tensor(compiled.rows, device=logits.device)
            rules = torch.tensor(compiled.rules, device=logits.device)
            logits[rows] += compiled.bias[rules]
        return logits


def _bias_table(grammar: Grammar, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """(rules, vocab) additive bias: 0 where a rule allows an id, -inf elsewhere."""
    rules = grammar.rules
    table = torch.full((len(rules), vocab), float("-inf"), dtype=dtype)
    for i, rule in enumerate(rules):
        row = table[i]
        if rule.invert:
            row.zero_()
        for lo, hi in rule.ranges:
            row[max(lo, 0) : min(hi, vocab)] = float("-inf") if rule.invert else 0.0
    return table
