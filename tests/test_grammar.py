"""Codec grammars (pure state machines): any stream sampled within their rules parses cleanly.

The parsers in tokens.py are the oracle: a random walk that only ever picks allowed ids must be
accepted by them, for every prompt form. The vLLM side is tested in test_engine_real.py.
"""

from __future__ import annotations

import random

import pytest
from engine_fakes import spark_ids

from pipecat_veena.engine.tokens import BiCodecParser, SnacIds, SnacParser
from pipecat_veena.generation.grammar import BiCodecGrammar, Rule, SnacGrammar, grammar_from_spec

VOCAB = 20000


def _bicodec(start: str) -> BiCodecGrammar:
    ids = spark_ids()
    return BiCodecGrammar(
        global_base=ids.global_base,
        num_global_codes=ids.num_global_codes,
        semantic_base=ids.semantic_base,
        num_semantic_codes=ids.num_semantic_codes,
        num_globals=32,
        start_global=ids.marker("start_global_token"),
        end_global=ids.marker("end_global_token"),
        start_semantic=ids.marker("start_semantic_token"),
        stops=(ids.eos, ids.marker("end_semantic_token")),
        free_allowance=13,
        start=start,
    )


def _walk(grammar, rng: random.Random, steps: int, vocab: int, *, stop_bias: float = 0.02):
    """Sample ``steps`` ids uniformly among those each state allows (stops rarely)."""
    rules, state, out = grammar.rules, grammar.initial(), []
    for _ in range(steps):
        rule = rules[state[0]]
        stops = [t for t in grammar.stops if rule.allows(t)]
        if stops and rng.random() < stop_bias:
            out.append(rng.choice(stops))
            break
        while True:  # rejection sampling over the vocabulary
            token = rng.randrange(vocab)
            if rule.allows(token) and token not in grammar.stops:
                break
        out.append(token)
        state = grammar.advance(state, token)
    return out


@pytest.mark.parametrize("start", ["free", "globals", "semantic"])
def test_bicodec_walks_always_parse(start: str) -> None:
    ids = spark_ids()
    grammar = _bicodec(start)
    rng = random.Random(start)
    for _ in range(200):
        out = _walk(grammar, rng, rng.randrange(1, 120), VOCAB)
        parser = BiCodecParser(ids, 32, prefilled=start == "semantic")
        semantics = parser.feed(out)  # raises MalformedStreamError on any fault
        assert len(semantics) == sum(1 for t in out if 0 <= t - ids.semantic_base < 8192)
        if len(out) > 60:
            assert parser.voice_ready


def test_bicodec_free_block_is_bounded_and_forces_the_globals() -> None:
    grammar = _bicodec("free")
    ids = spark_ids()
    state = grammar.initial()
    assert grammar.rules[state[0]].allows(ids.marker("start_global_token"))
    filler = ids.marker("start_acoustic_token")
    for _ in range(12):
        assert grammar.rules[state[0]].allows(filler)
        state = grammar.advance(state, filler)
    rule = grammar.rules[state[0]]
    allowed = [t for t in range(VOCAB) if rule.allows(t)]
    assert allowed == [ids.marker("start_global_token")]


def test_bicodec_rules_forbid_stops_before_the_semantics() -> None:
    grammar = _bicodec("free")
    ids = spark_ids()
    for rule in grammar.rules[:-1]:
        assert not rule.allows(ids.eos)
    assert grammar.rules[-1].allows(ids.eos)
    assert not grammar.rules[grammar.GLOBAL].allows(ids.semantic_base)
    assert not grammar.rules[grammar.SEMANTIC].allows(ids.global_base)


def test_snac_walks_are_whole_frames_in_slot_order() -> None:
    ids = SnacIds(base=128256)
    grammar = SnacGrammar(ids.audio_base, ids.codebook_size, ids.slots, ids.stop_ids)
    rng = random.Random(1)
    vocab = ids.audio_base + 7 * 4096 + 10
    for _ in range(100):
        out = _walk(grammar, rng, rng.randrange(1, 100), vocab, stop_bias=0.2)
        parser = SnacParser(ids)
        codes = parser.feed(out)
        if out[-1] in ids.stop_ids:
            assert len(codes) % 7 == 0


def test_spec_round_trip_and_errors() -> None:
    grammar = _bicodec("globals")
    spec = grammar.to_spec()
    assert grammar_from_spec(spec) == grammar
    assert grammar_from_spec({**spec, "stops": list(spec["stops"])}) == grammar
    with pytest.raises(ValueError, match="unknown grammar kind"):
        grammar_from_spec({"kind": "mp3"})
    with pytest.raises(ValueError, match="bad bicodec grammar spec"):
        grammar_from_spec({"kind": "bicodec", "global_base": 1})
    with pytest.raises(ValueError, match="start must be"):
        grammar_from_spec({**spec, "start": "middle"})


def test_rule_inversion() -> None:
    rule = Rule(((10, 20),), invert=True)
    assert rule.allows(5) and not rule.allows(10) and not rule.allows(19) and rule.allows(20)


def test_vllm_processor_masks_each_row_by_its_state_and_follows_batch_moves() -> None:
    """The vLLM logits processor: rows without a grammar are untouched, rows with one allow only
    what their state allows, states advance with the output ids, and batch moves are followed."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.sample.logits_processor import MoveDirectionality

    from pipecat_veena.generation.vllm_grammar import EXTRA_ARGS_KEY, GrammarLogitsProcessor

    ids = spark_ids()
    grammar = _bicodec("globals")
    with_grammar = SimpleNamespace(extra_args={EXTRA_ARGS_KEY: grammar.to_spec()})
    plain = SimpleNamespace(extra_args=None)
    processor = GrammarLogitsProcessor(None, torch.device("cpu"), False)
    outputs = [[], [], []]
    added = [(0, with_grammar, None, outputs[0]), (1, plain, None, outputs[1])]
    processor.update_state(SimpleNamespace(removed=[], added=added, moved=[]))

    def allowed(row: int) -> list[int]:
        logits = processor.apply(torch.zeros(3, VOCAB))
        return torch.nonzero(torch.isfinite(logits[row])).flatten().tolist()

    assert allowed(0) == list(range(ids.global_base, ids.global_base + 4096))
    assert len(allowed(1)) == VOCAB  # no grammar: untouched
    outputs[0].extend([ids.global_base] * 32)  # the 32 globals: now only end_global
    assert allowed(0) == [ids.marker("end_global_token")]
    outputs[0].extend([ids.marker("end_global_token"), ids.marker("start_semantic_token")])
    semantic = allowed(0)
    assert ids.eos in semantic and ids.semantic_base in semantic and ids.global_base not in semantic
    swap = SimpleNamespace(removed=[], added=[], moved=[(0, 2, MoveDirectionality.SWAP)])
    processor.update_state(swap)  # the grammar row now sits at index 2
    assert len(allowed(0)) == VOCAB and allowed(2) == semantic
    processor.update_state(SimpleNamespace(removed=[2], added=[], moved=[]))
    assert len(allowed(2)) == VOCAB
