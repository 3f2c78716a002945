"""The demo LLMs' seeded copy circuit, before any training step: its heads attend where
``pipecat_veena.demo.train`` says they do, on real training sequences of both demo tasks.

A property of the initialisation alone (a fixed seed, no learning), so it holds on any machine.
"""

from __future__ import annotations

import random

import pytest
import torch

from pipecat_veena.demo import spark, veena
from pipecat_veena.demo.train import Example, Task, TrainConfig, _Batcher, _SharedLM


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
