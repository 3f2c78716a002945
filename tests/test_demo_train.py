"""The demo LLMs' seeded copy circuit, before any training step: its heads attend where
``pipecat_veena.demo.train`` says they do, on real training sequences of both demo tasks.

A property of the initialisation alone (a fixed seed, no learning), so it holds on any machine.
"""

from __future__ import annotations

import random

import pytest
import torch

from pipecat_veena.demo import spark, veena
from pipecat_veena.demo.train import Example, Task, TrainConfig, _Batcher, _export, _SharedLM


@pytest.fixture(scope="module")
def seeded() -> tuple[_SharedLM, list[Task]]:
    tasks = [spark.spark_task(spark.spark_tokenizer()), veena.veena_task(veena.veena_tokenizer())]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = _SharedLM(TrainConfig(steps=1), tasks)
    model.body.config._attn_implementation = "eager"  # only eager attention returns weights
    return model.eval(), tasks


def _roles(task: Task, token: int) -> dict[str, object]:
    """Role -> feature value of one token's input features (e.g. "text" -> its text id)."""
    roles = {}
    for feature in task.in_features(token):
        role = task.role(feature)
        if role is not None:
            roles[role] = feature[1]
    return roles


def _unique_examples(task: Task, count: int) -> list[Example]:
    """Training sequences whose text ids are all different (at least three of them)."""
    rng, found = random.Random(7), []
    while len(found) < count:
        example = task.sample(rng)
        text = [t for t in example.ids[: example.prompt_len] if "text-token" in _roles(task, t)]
        if len(text) >= 3 and len(set(text)) == len(text):
            found.append(example)
    return found


def _attentions(model: _SharedLM, k: int, task: Task, example: Example) -> tuple:
    ids, _, _ = _Batcher(task)([example])
    with torch.no_grad():
        out = model.body(inputs_embeds=model.input_rows(k)[ids], output_attentions=True)
    return tuple(a[0] for a in out.attentions)  # per layer: (heads, T, T)


@pytest.mark.parametrize("k", [0, 1], ids=["spark", "veena"])
def test_seeded_heads_attend_as_designed(seeded, k: int) -> None:
    """Previous-token head: always one back. Copy head: at a chain's end the position after the
    text id just spoken, elsewhere the first token; random text vectors (12 dimensions) can
    look alike, so nearly always rather than always."""
    model, tasks = seeded
    task = tasks[k]
    hits = {"copy at chain ends": [], "rest elsewhere": []}
    previous = 0
    for example in _unique_examples(task, 8):
        layer0, layer1 = _attentions(model, k, task, example)
        ids = example.ids[:-1]  # the inputs (the last id is only a target)
        back = layer0[0].argmax(-1)
        assert (back[1:] == torch.arange(len(ids) - 1)).all(), "previous-token head missed"
        previous += len(ids) - 1
        after = {}  # text id -> the position after it in the prompt
        for p in range(example.prompt_len - 1):
            if "text-token" in (roles := _roles(task, ids[p])):
                after[roles["text"]] = p + 1
        copy = layer1[0].argmax(-1)
        for m in range(example.prompt_len, len(ids)):
            roles = _roles(task, ids[m])
            if "text" not in roles or "text-token" in roles:
                continue  # not a code of a chain (Spark's global tokens)
            if "chain-end" in roles:
                hits["copy at chain ends"].append(copy[m].item() == after[roles["text"]])
            else:
                hits["rest elsewhere"].append(copy[m].item() == 0)
    shares = {name: sum(h) / len(h) for name, h in hits.items()}
    assert previous > 200 and min(len(h) for h in hits.values()) >= 30, hits
    assert shares["copy at chain ends"] >= 0.9 and shares["rest elsewhere"] >= 0.98, shares


def test_speaker_head_reads_the_speaker_tag(seeded) -> None:
    model, tasks = seeded
    task = tasks[1]
    for example in _unique_examples(task, 3):
        _, layer1 = _attentions(model, 1, task, example)
        tag = next(p for p, t in enumerate(example.ids) if "speaker-tag" in _roles(task, t))
        assert (layer1[2].argmax(-1)[tag:] == tag).all()


def _allowed(rule, vocab_size: int) -> torch.Tensor:
    """(V,) bool: the ids a grammar rule lets the engine sample."""
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    for lo, hi in rule.ranges:
        inside[lo:hi] = True
    return ~inside if rule.invert else inside


def _grammar_state(task: Task, example: Example) -> tuple:
    """The engine's grammar for a training sequence and its state where the prompt ends."""
    if task.name == "veena":
        grammar = veena.snac_grammar()
        return grammar, grammar.initial()
    grammar = spark.codec_grammar(spark.spark_tokenizer())
    last = example.ids[example.prompt_len - 1]
    if last == grammar.start_global:  # a named speaker: the model writes the globals
        return grammar, (grammar.GLOBAL, 0)
    if last == grammar.end_global:  # globals filled in
        return grammar, (grammar.START_SEMANTIC, 0)
    return grammar, (grammar.FREE, 0)  # controllable: the acoustic block first


@pytest.mark.parametrize("k", [0, 1], ids=["spark", "veena"])
def test_loss_is_the_cross_entropy_of_what_the_engine_samples(seeded, k: int) -> None:
    """The training loss (compact ids, one shared row for the unused ones, per grammar state)
    equals the cross-entropy of the exported full-vocabulary model, its softmax taken over the
    ids the engine's grammar mask leaves at each target, walked with the grammar's own state
    machine from where the prompt leaves it (Spark: free block, globals or semantics; Veena:
    a frame's start)."""
    model, tasks = seeded
    task = tasks[k]
    examples = [task.sample(random.Random(seed)) for seed in range(11, 17)]
    with torch.no_grad():
        loss = model.loss(k, *_Batcher(task)(examples)).item()
        full = _export(model, TrainConfig(steps=1), k, task)
        nll = []
        for example in examples:
            logits = full(torch.tensor([example.ids[:-1]])).logits[0]  # (T, V)
            grammar, state = _grammar_state(task, example)
            for p in range(example.prompt_len - 1, len(example.ids) - 1):
                target = example.ids[p + 1]
                allowed = _allowed(grammar.rules[state[0]], task.vocab_size)
                assert allowed[target], f"target {target} outside its grammar state {state}"
                row = logits[p].masked_fill(~allowed, float("-inf"))
                nll.append(-torch.log_softmax(row, dim=0)[target].item())
                state = grammar.advance(state, target)
    assert len(nll) > 100
    assert loss == pytest.approx(sum(nll) / len(nll), rel=1e-4)
