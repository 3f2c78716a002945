"""Trains the tiny demo LLMs on synthetic token sequences, jointly and deterministically.

Both demo LLMs (Spark: Qwen2, Veena: Llama) learn the same skill: copy the text, token by token,
into fixed chains of codec tokens, after a voice-dependent preamble. They share one transformer
body, trained on alternating batches of each task; each task has its own token embeddings and
output rows. The body is a Llama without biases, which is also a Qwen2 with zero q/k/v biases,
so each task exports as its own architecture.

Codec ids that stand for a text id (a semantic code, a SNAC frame code) get embeddings that share
a "text" vector with that text id (embedding = sum of feature vectors, see ``Task``): the model
then relates a code to its text id without learning each pair, and copying (induction) forms
much sooner. On export the sums become plain embedding rows.

Copying needs an induction circuit: at a chain's end, a head finds the prompt position whose
previous id is the text id just spoken, and reads the id there. Gradient descent takes hundreds
of steps to find one, so it starts built (``_seed_copy_circuit``) from the roles the tasks give
their features (``Task.role``): in layer 0 a head looks one position back and copies that
token's text vector; in layer 1, at a chain's last code, a head looks for the text token that
followed the current text id and copies its text vector, which the first code of the next chain
shares (elsewhere it rests on the prompt's first token); a second one copies the speaker's
vector, which Veena's speaker-dependent codes share; the end-of-speech row fires at a chain's
end where no text followed. Training then tunes it. Measured on 24 held-out examples per model
(teacher-forced, 300 steps in all), the share of chain starts predicted right where the text id
just spoken is unique in the text: 0.98 (Spark) and 0.99 (Veena) after 150 steps, 1.00 and
1.00 after 300; with only the previous-token head seeded, 0.00 and 0.00, then 0.16 and 0.17.
Where the id repeats the circuit cannot tell the places apart (0.74 and 0.60 after 300 steps):
matching the two ids before as well would be the next step.

The vocabularies are large (13.7k ids for Spark, 157k for Veena) but the data uses a few thousand
ids, so training runs in a compact id space. Every output id a task never uses shares one
learned row ``r``: the cross-entropy stays exact at the cost of one extra logit
(``h @ r + log(number of unused ids)``), and ``r`` fills those rows on export. The softmax at
each target spans only the ids the engine's codec grammar allows there (``Task.rules``): with
the grammar mask on (``EngineConfig.constrain_grammar``, the default) that is the distribution
the model samples from, so it need not learn what the mask enforces, and a Veena code competes
with the codes of its own slot (a seventh of the rows). Off the grammar the demo LLMs are not
trained to stay on it.

Deterministic: torch's deterministic algorithms, a fixed seed and data drawn from
``random.Random``; the bytes then do not depend on the thread count either (checked on one
machine and one set of library versions).
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from loguru import logger
from torch import Tensor, nn
from tqdm import tqdm

from pipecat_veena.generation.grammar import Rule

#: Torch threads while training.
THREADS = 2
#: Batches drawn together and grouped by length: padding adds 9-12 % to the tokens (4: 38-55 %).
_BUCKETS = 16
#: RoPE base of the demo LLMs (Qwen2's): its slowest pairs turn less than 0.6 rad over the
#: longest sequence (580 ids), so the seeded copy head can match text ids at any distance.
ROPE_THETA = 1e6
#: The feature every row has (a constant vector) and the one dimension it sets at the start.
_CONSTANT = ("constant",)
_CONSTANT_DIM = 0
#: Residual dimensions the seeded copy circuit uses; every other weight starts random.
_TEXT_DIMS = tuple(range(1, 13))  # a text id's vector (its codes share it)
_TEXT_TOKEN_DIM = 13  # set on text tokens, not on their codes
_CHAIN_END_DIM = 14  # set on the last code of a chain
_START_DIM = 15  # set on a prompt's first token (where the copy head rests)
_PREV_TEXT_DIMS = tuple(range(16, 28))  # layer 0: the previous token's text vector
_PREV_TEXT_TOKEN_DIM = 28  # layer 0: whether the previous token was a text token
_SPEAKER_DIMS = tuple(range(29, 37))  # a speaker's vector (its tag and its codes share it)
_SPEAKER_TAG_DIM = 37  # set on a prompt's speaker tag
_NEXT_TEXT_DIM = 38  # layer 1: whether the copy head read a text token (else: the text ended)
_FILLER_DIM = 39  # tops every input up to the same length on the circuit's dimensions
#: Squared length of every input on the circuit's dimensions (a text vector and a flag).
_CONTENT = 2.0
#: Feature roles a task gives (``Task.role``) and the dimension each sets.
_ROLE_DIMS = {
    "text-token": _TEXT_TOKEN_DIM,
    "chain-end": _CHAIN_END_DIM,
    "start": _START_DIM,
    "speaker-tag": _SPEAKER_TAG_DIM,
}
#: RoPE pairs (the highest frequencies) of the seeded previous-token head: enough to single
#: out the position one back at every distance up to 4096 (the next best scores 0.57 less).
_SEED_PAIRS = 6
#: RoPE pairs of the copy head: content match on the slowest six (12 dims, one per text
#: dimension), "previous token is text" on the next, "rest at the start" on the one before.
_COPY_PAIRS, _TEXT_TOKEN_PAIR, _START_PAIR = tuple(range(10, 16)), 9, 8
#: RMSNorm scale of a token's input at layer 0 and layer 1, sqrt(hidden) over its length: 1
#: for the constant, sqrt(_CONTENT) on the circuit, ~0.3 of random features; at layer 1 also
#: the previous token's copy and the random heads' and MLP's output (measured: 4.2-5.0).
_NORM0, _NORM1 = 6.4, 4.6
#: Attention scores (logits) the seeded heads start with, and the copy's output gain.
_PREV_SCORE = 21.0  # per unit of RoPE cosine: 12 logits between one back and the next best
_COPY_SCORE = 30.0  # matching text vector (random ones in 12 dims: cosine sd 0.29)
_TEXT_TOKEN_SCORE = 30.0  # the previous token is a text token: codes of the id fall behind
_START_SCORE = 50.0  # not at a chain's end: rest on the prompt's first token
_COPY_GAIN = 3.0  # the copied text vector outweighs the current one 3:1
_SPEAKER_SCORE = 30.0  # the speaker head: the prompt's speaker tag
_END_LOGIT = 3.0  # end-of-speech output row on the chain-end and next-text dimensions


@dataclass(frozen=True)
class Example:
    """One training sequence: the prompt then the completion the model must learn.

    Attributes:
        ids: full-vocabulary token ids, prompt first.
        prompt_len: how many leading ids are prompt (no loss on predicting them).
    """

    ids: tuple[int, ...]
    prompt_len: int


Sampler = Callable[[random.Random], Example]
#: Token id -> the keys of the feature vectors whose sum is its embedding (or output row).
Features = Callable[[int], tuple]


@dataclass(frozen=True)
class Task:
    """One demo LLM: its data and the model it exports as.

    Parameters:
        name: the task's name (progress and results).
        arch: "qwen2" (Spark-TTS LLM) or "llama" (Veena / Orpheus LLM).
        vocab_size: the full vocabulary of the exported model (tokenizer size, padded).
        sample: draws one example from a ``random.Random``.
        inputs: every id the examples feed in (sorted, unique).
        outputs: every id the examples predict (sorted, unique).
        in_features: id -> feature keys of its input embedding.
        out_features: id -> feature keys of its output row (tied: must be ``in_features``).
        tied: tie input and output embeddings (``inputs`` must then equal ``outputs``).
        bos_id, eos_id: written into the model config.
        role: feature key -> its role in the seeded copy circuit: "text" (a text id's vector,
            shared by the text token and its codes), "text-token" (only text tokens have it),
            "chain-end" (only a chain's last code has it), "start" (a prompt's first token),
            "speaker" (a speaker's vector, shared by its tag and its codes), "speaker-tag"
            (only speaker tags have it), "end" (the end-of-speech output); None for the rest.
        rules: the codec grammar's states as the engine masks them (``Grammar.rules``), when
            each output id is sampled in one state only. The loss at a target is then the
            cross-entropy over the ids its state allows, the distribution the model samples
            from with the grammar mask on, and the model does not spend steps learning what the
            mask enforces; empty: over the whole vocabulary.
    """

    name: str
    arch: str
    vocab_size: int
    sample: Sampler
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    in_features: Features
    out_features: Features
    tied: bool = False
    bos_id: int | None = None
    eos_id: int | None = None
    role: Callable[[tuple], str | None] = lambda feature: None
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class TrainConfig:
    """The shared transformer and its optimisation.

    Parameters:
        steps: optimiser steps (batches alternate between the tasks).
        batch_size: sequences per step.
        lr: peak AdamW learning rate (linear warm-up, cosine decay to a tenth).
        warmup: warm-up steps.
        seed: seeds the weights and the data.
        hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim: the
            transformer (head_dim >= 32: the vLLM CPU attention needs it).
    """

    steps: int
    batch_size: int = 14
    lr: float = 3e-3
    warmup: int = 40
    seed: int = 0
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32


def hf_config(cfg: TrainConfig, arch: str, vocab_size: int, **extra: Any) -> Any:
    """A transformers config of the shared body's shape."""
    from transformers import LlamaConfig, Qwen2Config

    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if arch not in classes:
        raise ValueError(f"unknown demo LLM architecture {arch!r}; use 'qwen2' or 'llama'")
    return classes[arch](
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=4096,
        rope_theta=ROPE_THETA,
        rms_norm_eps=1e-6,
        **extra,
    )


class _SharedLM(nn.Module):
    """One transformer body; every task's rows are sums of vectors of one feature table."""

    def __init__(self, cfg: TrainConfig, tasks: Sequence[Task]) -> None:
        super().__init__()
        from transformers import LlamaModel

        keys: dict[tuple, int] = {_CONSTANT: 0}  # row 0: the constant vector of every input
        self.in_index = [self._index(keys, k, t.inputs, t.in_features) for k, t in enumerate(tasks)]
        self.out_index = [
            self._index(keys, k, t.outputs, t.out_features) for k, t in enumerate(tasks)
        ]
        for task, idx_in, idx_out in zip(tasks, self.in_index, self.out_index, strict=True):
            if task.tied and not torch.equal(idx_in, idx_out):
                raise ValueError(f"task {task.name}: a tied LLM needs the same inputs and features")
        self.table = nn.Parameter(torch.randn(len(keys), cfg.hidden_size) * 0.02)
        config = hf_config(cfg, "llama", 1, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        config._attn_implementation = "sdpa"
        self.body = LlamaModel(config)
        roles = {row: tasks[key[0]].role(key[1]) for key, row in keys.items() if key != _CONSTANT}
        _seed_copy_circuit(self.table, self.body, cfg, roles, self.in_index)
        self.other = nn.Parameter(torch.zeros(len(tasks), cfg.hidden_size))
        self.classes = [_OutputClasses(t) for t in tasks]

    @staticmethod
    def _index(keys: dict[tuple, int], k: int, ids: Sequence[int], features: Features) -> Tensor:
        """(len(ids), F) indexes into the feature table; -1 pads (a zero vector)."""
        rows = [[keys.setdefault((k, f), len(keys)) for f in features(t)] for t in ids]
        width = max(len(r) for r in rows)
        return torch.tensor([r + [-1] * (width - len(r)) for r in rows])

    def _rows(self, index: Tensor) -> Tensor:
        table = torch.cat([self.table, self.table.new_zeros(1, self.table.shape[1])])
        return table[index].sum(dim=1)  # (N, F, H) -> (N, H); index -1 is the zero row

    def input_rows(self, k: int) -> Tensor:
        """Task k's input embeddings over its compact input ids, (I_k, H).

        Each is its features' sum plus the constant vector (row 0 of the table).
        """
        return self._rows(self.in_index[k]) + self.table[0]

    def output_rows(self, k: int) -> Tensor:
        """Task k's output matrix over its compact output ids, (O_k, H).

        Without the constant vector: added to every output row (as a tied export does), it would
        add the same logit to every id and change no probability.
        """
        return self._rows(self.out_index[k])

    def loss(self, k: int, ids: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
        """Mean cross-entropy of task k's ``targets`` where ``mask``; all three are (B, T).

        Each target competes with the ids of its grammar state only (``Task.rules``).
        """
        embeds = self.input_rows(k)[ids]  # (B, T, H)
        hidden = self.body(inputs_embeds=embeds).last_hidden_state[mask]  # (N, H) at targets
        targets = targets[mask]  # (N,)
        rows, classes = self.output_rows(k), self.classes[k]
        total, counted = hidden.new_zeros(()), 0
        for c, (members, log_unused) in enumerate(classes.members):
            where = classes.of[targets] == c
            count = int(where.sum())
            if not count:
                continue
            counted += count
            h = hidden[where]  # (N_c, H)
            scores = h @ rows[members].T  # (N_c, O_c)
            if log_unused is not None:  # (N_c, 1): the state's unused ids, one row for all
                scores = torch.cat([scores, (h @ self.other[k] + log_unused)[:, None]], dim=1)
            total = total + nn.functional.cross_entropy(
                scores, classes.place[targets[where]], reduction="sum"
            )
        if counted != len(targets):
            raise ValueError(f"task {k}: a target id that no grammar state allows (Task.rules)")
        return total / len(targets)


class _OutputClasses:
    """A task's compact output ids grouped by the grammar state they are sampled in.

    Attributes:
        members: per state, its compact output indexes and the log of how many ids it allows
            that the task never outputs (they share one row: ``_SharedLM.other``); None when
            there are none.
        of: (O,) each compact output's state; -1 where no state allows it (a tied model's
            prompt ids: never a target).
        place: (O,) each compact output's index within its state's ``members``.

    Raises:
        ValueError: an output id that more than one rule allows.
    """

    def __init__(self, task: Task) -> None:
        rules = task.rules or (Rule(((0, task.vocab_size),)),)
        states = []
        for token in task.outputs:
            allowed = [r for r, rule in enumerate(rules) if rule.allows(token)]
            if len(allowed) > 1:
                raise ValueError(
                    f"task {task.name}: output id {token} is allowed by {len(allowed)} grammar "
                    "states; give every output at most one (or leave rules empty)"
                )
            states.append(allowed[0] if allowed else -1)
        self.of = torch.tensor(states)
        self.place = torch.zeros(len(states), dtype=torch.long)
        self.members: list[tuple[Tensor, float | None]] = []
        for r, rule in enumerate(rules):
            members = (self.of == r).nonzero().flatten()
            self.place[members] = torch.arange(len(members))
            unused = _allowed_count(rule, task.vocab_size) - len(members)
            self.members.append((members, math.log(unused) if unused > 0 else None))


def _allowed_count(rule: Rule, vocab_size: int) -> int:
    """How many ids of a ``vocab_size`` vocabulary ``rule`` allows."""
    inside = sum(max(min(hi, vocab_size) - max(lo, 0), 0) for lo, hi in rule.ranges)
    return vocab_size - inside if rule.invert else inside


@torch.no_grad()
def _seed_copy_circuit(
    table: Tensor,
    body: nn.Module,
    cfg: TrainConfig,
    roles: dict[int, str | None],
    inputs: Sequence[Tensor],
) -> None:
    """Build the induction circuit that copies text ids into chains (see the module docstring).

    Feature rows first: row 0 (the constant every input has) becomes a unit vector on
    ``_CONSTANT_DIM``; a "text" ("speaker") row gets a random unit vector on ``_TEXT_DIMS``
    (``_SPEAKER_DIMS``); the "end" row reads ``_CHAIN_END_DIM`` minus ``_NEXT_TEXT_DIM``; the
    other roles set their own dimension to 1. Every other row is zero on the circuit's
    dimensions. Then ``_equalise`` gives every input (``inputs``: each task's feature indexes)
    the same length there, so that RMSNorm scales every token alike.

    Layer 0, head 0 looks one position back (``_seed_previous_token_head``) and writes that
    token's text vector and text-token flag into ``_PREV_TEXT_DIMS`` and
    ``_PREV_TEXT_TOKEN_DIM``. Layer 1, head 0 scores key position n from query position m as

        _COPY_SCORE * cos(text(m), previous text(n))
        + _TEXT_TOKEN_SCORE * [m ends a chain] * [token n - 1 is a text token]
        + _START_SCORE * [m does not end a chain] * [n is the prompt's first token]

    on RoPE pairs slow enough to ignore distance, so that at a chain's end it reads the text
    token that followed the current text id in the prompt, and elsewhere rests on the first
    token, whose text vector is zero. It adds what it reads, times ``_COPY_GAIN``, to the text
    dimensions, and its text-token flag to ``_NEXT_TEXT_DIM``. Layer 1, head 2 copies the
    speaker's vector (``_seed_speaker_head``). The rest of those heads, the other heads and both
    MLPs keep their random start.
    """
    circuit = [*_TEXT_DIMS, *_ROLE_DIMS.values(), *_PREV_TEXT_DIMS, _PREV_TEXT_TOKEN_DIM]
    circuit += [*_SPEAKER_DIMS, _NEXT_TEXT_DIM]
    table[:, [*circuit, _FILLER_DIM]] = 0.0
    table[0].zero_()
    table[0, _CONSTANT_DIM] = 1.0
    vectors = {"text": _TEXT_DIMS, "speaker": _SPEAKER_DIMS}
    for row, role in roles.items():
        if role in vectors:
            vector = torch.randn(len(vectors[role]))
            table[row, list(vectors[role])] = vector / vector.norm()
        elif role == "end":
            table[row, _CHAIN_END_DIM], table[row, _NEXT_TEXT_DIM] = _END_LOGIT, -_END_LOGIT
        elif role is not None:
            table[row, _ROLE_DIMS[role]] = 1.0
    _equalise(table, inputs, roles, circuit)
    _seed_previous_token_head(body.layers[0].self_attn, cfg)
    _seed_copy_head(body.layers[1].self_attn, cfg)
    _seed_speaker_head(body.layers[1].self_attn, cfg)


def _equalise(
    table: Tensor, inputs: Sequence[Tensor], roles: dict[int, str | None], dims: list[int]
) -> None:
    """Top every input up to ``_CONTENT`` (squared length on ``dims``) on ``_FILLER_DIM``.

    The seeded previous-token head reads the constant dimension, which RMSNorm scales by the
    inverse of the token's length: a token with less on the circuit (a structure token) would
    otherwise be a 1.7 times louder key and draw the head two or three positions back. Each
    input's shortfall goes on its first feature row that is not a shared vector ("text",
    "speaker"); the tasks' features are such that every input sharing that row falls short
    by the same amount (a code's place in its chain, a structure token's own row).

    Raises:
        ValueError: when two inputs need different amounts on one row, or one is too long.
    """
    content = table[:, dims].square().sum(dim=1)
    filler: dict[int, float] = {}
    for index in inputs:
        for rows in index.tolist():
            rows = [r for r in rows if r >= 0]
            if any(roles.get(r) == "end" for r in rows):
                continue  # end of speech ends a sequence: never an input (tied Veena lists it)
            short = _CONTENT - sum(content[r].item() for r in rows)
            free = [r for r in rows if roles.get(r) not in ("text", "speaker")]
            if short < -1e-6 or (short > 1e-6 and not free):
                raise ValueError(f"demo LLM input with features {rows}: cannot fill to length")
            if free and abs(filler.setdefault(free[0], short) - short) > 1e-6:
                raise ValueError(f"feature row {free[0]} would need two different fillers")
    for row, short in filler.items():
        table[row, _FILLER_DIM] = math.sqrt(max(short, 0.0))


def _pair_rows(cfg: TrainConfig, head: int, pairs: Sequence[int]) -> list[int]:
    """Rows of a head's query (or key) that RoPE pairs ``pairs`` use: i and i + head_dim / 2."""
    base, half = head * cfg.head_dim, cfg.head_dim // 2
    return [base + i for i in pairs] + [base + i + half for i in pairs]


def _weight(score: float, norm: float, cfg: TrainConfig) -> float:
    """Query and key weight for unit inputs scaled by ``norm``: their dot product is ``score``."""
    return math.sqrt(score * math.sqrt(cfg.head_dim)) / norm


def _copy_values(attn: nn.Module, v_head: int, o_head: int, moves: Sequence[tuple]) -> None:
    """Make value head ``v_head`` read and query head ``o_head``'s output write dimensions.

    ``moves`` are (from dim, to dim, gain); the rows and columns they use start at zero, the
    rest of the head keeps its random start.
    """
    v, o = attn.v_proj.weight, attn.o_proj.weight
    head_dim = v.shape[0] // attn.config.num_key_value_heads
    for j, (src, dst, gain) in enumerate(moves):
        v[v_head * head_dim + j] = 0.0
        o[:, o_head * head_dim + j] = 0.0
        v[v_head * head_dim + j, src] = 1.0
        o[dst, o_head * head_dim + j] = gain


def _seed_previous_token_head(attn: nn.Module, cfg: TrainConfig) -> None:
    """Query head 0 of ``attn`` (layer 0; key/value head 0) looks one position back.

    On ``_SEED_PAIRS`` RoPE pairs the key reads the constant dimension as (1, 0) and the query
    as (cos t, -sin t), t the pair's frequency: the score of key position n from query m is then
    proportional to the sum over the pairs of cos(t * (m - n - 1)), largest at n = m - 1.
    It copies that token's text vector and text-token flag to the "previous" dimensions, at
    their original length.
    """
    half = cfg.head_dim // 2
    q, k = attn.q_proj.weight, attn.k_proj.weight
    rows = _pair_rows(cfg, 0, range(_SEED_PAIRS))
    q[rows], k[rows] = 0.0, 0.0
    w = _weight(_PREV_SCORE, _NORM0, cfg)
    for i in range(_SEED_PAIRS):
        theta = ROPE_THETA ** (-2 * i / cfg.head_dim)
        q[i, _CONSTANT_DIM], q[i + half, _CONSTANT_DIM] = w * math.cos(theta), -w * math.sin(theta)
        k[i, _CONSTANT_DIM] = w
    sources = [*_TEXT_DIMS, _TEXT_TOKEN_DIM]
    targets = [*_PREV_TEXT_DIMS, _PREV_TEXT_TOKEN_DIM]
    _copy_values(attn, 0, 0, [(s, t, 1.0 / _NORM0) for s, t in zip(sources, targets, strict=True)])


def _seed_copy_head(attn: nn.Module, cfg: TrainConfig) -> None:
    """Query head 0 of ``attn`` (layer 1; key/value head 0) is the copy head.

    Scores as in ``_seed_copy_circuit``; it adds the text vector it reads (times
    ``_COPY_GAIN``) to the text dimensions and its text-token flag to ``_NEXT_TEXT_DIM``.
    """
    q, k = attn.q_proj.weight, attn.k_proj.weight
    pairs = [_START_PAIR, _TEXT_TOKEN_PAIR, *_COPY_PAIRS]
    rows = _pair_rows(cfg, 0, pairs)
    q[rows], k[rows] = 0.0, 0.0
    w = _weight(_COPY_SCORE, _NORM1, cfg)
    content = _pair_rows(cfg, 0, _COPY_PAIRS)
    for row, src, dst in zip(content, _TEXT_DIMS, _PREV_TEXT_DIMS, strict=True):
        q[row, src], k[row, dst] = w, w
    w = _weight(_TEXT_TOKEN_SCORE, _NORM1, cfg)
    q[_TEXT_TOKEN_PAIR, _CHAIN_END_DIM], k[_TEXT_TOKEN_PAIR, _PREV_TEXT_TOKEN_DIM] = w, w
    w = _weight(_START_SCORE, _NORM1, cfg)
    q[_START_PAIR, _CONSTANT_DIM], q[_START_PAIR, _CHAIN_END_DIM] = w, -w
    k[_START_PAIR, _START_DIM] = w
    moves = [(d, d, _COPY_GAIN / _NORM1) for d in _TEXT_DIMS]
    _copy_values(attn, 0, 0, [*moves, (_TEXT_TOKEN_DIM, _NEXT_TEXT_DIM, 1.0 / _NORM1)])


def _seed_speaker_head(attn: nn.Module, cfg: TrainConfig) -> None:
    """Query head 2 of ``attn`` (layer 1; key/value head 1) copies the speaker's vector.

    Every position attends to the prompt's speaker tag (its flag against the constant, on the
    slowest RoPE pair) and adds the tag's speaker vector, which the codes that depend on the
    speaker share. Where a prompt has no tag, it averages what the rest of the head reads.
    """
    q, k = attn.q_proj.weight, attn.k_proj.weight
    slowest = cfg.head_dim // 2 - 1
    q_rows, k_rows = _pair_rows(cfg, 2, [slowest]), _pair_rows(cfg, 1, [slowest])
    q[q_rows], k[k_rows] = 0.0, 0.0
    w = _weight(_SPEAKER_SCORE, _NORM1, cfg)
    q[q_rows[0], _CONSTANT_DIM], k[k_rows[0], _SPEAKER_TAG_DIM] = w, w
    _copy_values(attn, 1, 2, [(d, d, 1.0 / _NORM1) for d in _SPEAKER_DIMS])


class _Batcher:
    """Turns one task's examples into right-padded compact tensors (causal: padding is inert)."""

    def __init__(self, task: Task) -> None:
        self.in_map = {t: i for i, t in enumerate(task.inputs)}
        self.out_map = {t: i for i, t in enumerate(task.outputs)}

    def __call__(self, examples: Sequence[Example]) -> tuple[Tensor, Tensor, Tensor]:
        length = max(len(e.ids) for e in examples) - 1
        ids = torch.zeros(len(examples), length, dtype=torch.long)
        targets = torch.zeros(len(examples), length, dtype=torch.long)
        mask = torch.zeros(len(examples), length, dtype=torch.bool)
        for b, e in enumerate(examples):
            n = len(e.ids) - 1
            ids[b, :n] = torch.tensor([self.in_map[t] for t in e.ids[:-1]])
            tail = [self.out_map[t] for t in e.ids[e.prompt_len :]]
            targets[b, e.prompt_len - 1 : n] = torch.tensor(tail)
            mask[b, e.prompt_len - 1 : n] = True
        return ids, targets, mask


def train_lms(cfg: TrainConfig, tasks: Sequence[Task], *, desc: str) -> dict[str, nn.Module]:
    """Train the demo LLMs together; return each as a full-vocabulary Hugging Face causal LM.

    Args:
        cfg: the shared body and the optimisation.
        tasks: the LLMs to train (batches alternate between them).
        desc: progress-bar label.

    Returns:
        ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` models (float32, eval mode) by task name.
    """
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(THREADS)
    # Parallel scatter-adds (embedding gradients) otherwise sum in a varying order.
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            model = _SharedLM(cfg, tasks)
            _optimise(model, cfg, tasks, desc)
        return {t.name: _export(model, cfg, k, t) for k, t in enumerate(tasks)}
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _optimise(model: _SharedLM, cfg: TrainConfig, tasks: Sequence[Task], desc: str) -> None:
    rng = random.Random(cfg.seed)
    batchers = [_Batcher(t) for t in tasks]
    queues: list[list[list[Example]]] = [[] for _ in tasks]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        progress = (step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses = [float("nan")] * len(tasks)
    progress = _Progress(cfg.steps, desc)
    for step in range(cfg.steps):
        k = step % len(tasks)
        if not queues[k]:
            queues[k] = _length_bucketed(rng, tasks[k].sample, cfg.batch_size)
        loss = model.loss(k, *batchers[k](queues[k].pop()))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses[k] = 0.9 * losses[k] + 0.1 * loss.item() if step >= len(tasks) else loss.item()
        progress.step({t.name: f"{v:.3f}" for t, v in zip(tasks, losses, strict=True)})
    progress.close()
    logger.debug(f"{desc}: {cfg.steps} steps, smoothed losses {losses}")


class _Progress:
    """A tqdm bar on a terminal; elsewhere (a CI log) an INFO line every tenth of the steps.

    tqdm writes one line per refresh where stderr is not a terminal: thousands in a log.
    """

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done = total, desc, 0
        self.every = max(total // 10, 1)
        tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, desc=desc, unit="step", mininterval=1.0) if tty else None

    def step(self, figures: dict[str, str]) -> None:
        """Count one step; ``figures`` (e.g. losses by task) go on the bar or the line."""
        self.done += 1
        if self.bar is not None:
            if self.done % 10 == 1:
                self.bar.set_postfix(figures, refresh=False)
            self.bar.update()
        elif self.done % self.every == 0 or self.done == self.total:
            shown = ", ".join(f"{k} {v}" for k, v in figures.items())
            logger.info(f"{self.desc}: step {self.done}/{self.total} ({shown})")

    def close(self) -> None:
        """End the bar (nothing to do for log lines)."""
        if self.bar is not None:
            self.bar.close()


def _length_bucketed(rng: random.Random, sample: Sampler, batch_size: int) -> list[list[Example]]:
    """Draw ``_BUCKETS`` batches at once, grouped by length, in random order."""
    examples = sorted((sample(rng) for _ in range(batch_size * _BUCKETS)), key=lambda e: len(e.ids))
    batches = [examples[i : i + batch_size] for i in range(0, len(examples), batch_size)]
    rng.shuffle(batches)
    return batches


@torch.no_grad()
def _export(model: _SharedLM, cfg: TrainConfig, k: int, task: Task) -> nn.Module:
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    config = hf_config(
        cfg,
        task.arch,
        task.vocab_size,
        tie_word_embeddings=task.tied,
        bos_token_id=task.bos_id,
        eos_token_id=task.eos_id,
        torch_dtype="float32",
    )
    cls = Qwen2ForCausalLM if task.arch == "qwen2" else LlamaForCausalLM
    full = cls(config)
    state = {f"model.{k}": v for k, v in model.body.state_dict().items() if "embed_tokens" not in k}
    if task.arch == "qwen2":  # Qwen2 always has q/k/v biases: zero is the bias-free body
        for name, tensor in full.state_dict().items():
            if name.endswith("_proj.bias"):
                state[name] = torch.zeros_like(tensor)
    head = model.other[k].expand(task.vocab_size, -1).clone()
    head[torch.tensor(task.outputs)] = model.output_rows(k)
    if task.tied:  # the input rows carry the constant; in every output row it changes nothing
        state["model.embed_tokens.weight"] = head + model.table[0]
    else:
        embed = torch.zeros(task.vocab_size, cfg.hidden_size)
        embed[torch.tensor(task.inputs)] = model.input_rows(k)
        state["model.embed_tokens.weight"] = embed
        state["lm_head.weight"] = head
    missing, unexpected = full.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if not (task.tied and m == "lm_head.weight")]:
        raise RuntimeError(f"demo LLM export: missing {missing}, unexpected {unexpected}")
    return full.eval()
