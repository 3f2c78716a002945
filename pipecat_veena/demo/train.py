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
previous id is the text id just spoken, and reads the id there. Its first half is a head that
looks one position back; gradient descent takes hundreds of steps to find it, so it starts built
(``_seed_previous_token_head``): every input row also has a shared constant vector (one
dimension, ``_CONSTANT_DIM``), and layer 0's first head reads only that dimension, its query
turned by one RoPE step, so that each position attends to the one before. Measured on 24
held-out examples per model (teacher-forced: the right text id at each chain's end), after 600
of 1200 steps: 0.88 (Spark) and 0.91 (Veena) with it, 0.27 and 0.29 without; after 1200: 0.98
and 0.99 against 0.78 and 0.72.

The vocabularies are large (13.7k ids for Spark, 157k for Veena) but the data uses a few thousand
ids, so training runs in a compact id space. Every output id a task never uses shares one
learned row ``r``: the loss is the exact full-vocabulary cross-entropy at the cost of one extra
logit (``h @ r + log(number of unused ids)``), and ``r`` fills those rows on export.

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

#: Torch threads while training.
THREADS = 2
#: Batches drawn together and grouped by length (less padding).
_BUCKETS = 4
#: RoPE base of the demo LLMs.
ROPE_THETA = 10000.0
#: The feature every row has (a constant vector) and the one dimension it sets at the start.
_CONSTANT = ("constant",)
_CONSTANT_DIM = 0
#: RoPE pairs (the highest frequencies) of the seeded previous-token head: enough to single
#: out the position one back at every distance up to 4096 (the next best scores 0.69 less).
_SEED_PAIRS = 6


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
        _seed_previous_token_head(self.table, self.body, cfg)
        self.other = nn.Parameter(torch.zeros(len(tasks), cfg.hidden_size))
        self.log_unused = [math.log(max(t.vocab_size - len(t.outputs), 1)) for t in tasks]

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
        """Mean cross-entropy of task k's ``targets`` where ``mask``; all three are (B, T)."""
        embeds = self.input_rows(k)[ids]  # (B, T, H)
        hidden = self.body(inputs_embeds=embeds).last_hidden_state[mask]  # (N, H) at targets
        logits = hidden @ self.output_rows(k).T  # (N, O_k)
        other = (hidden @ self.other[k] + self.log_unused[k])[:, None]  # (N, 1): unused ids
        return nn.functional.cross_entropy(torch.cat([logits, other], dim=1), targets[mask])


@torch.no_grad()
def _seed_previous_token_head(table: Tensor, body: nn.Module, cfg: TrainConfig) -> None:
    """Make layer 0's first head attend to the position before (the start of an induction head).

    Row 0 of ``table`` (the constant feature every token has) becomes a unit vector on
    ``_CONSTANT_DIM``, which then dominates that dimension after the input norm (about
    sqrt(hidden_size) there, whatever the token). On ``_SEED_PAIRS`` RoPE pairs of the head,
    the key reads that dimension as (1, 0) and the query as (cos t, -sin t), t the pair's
    frequency: the score of key position n from query position m is then the sum over the
    pairs of cos(t * (m - n - 1)), largest at n = m - 1. The rest of the head, and every
    other weight, keeps its random start.
    """
    table[0].zero_()
    table[0, _CONSTANT_DIM] = 1.0
    attn = body.layers[0].self_attn
    half = cfg.head_dim // 2
    for i in range(_SEED_PAIRS):
        theta = ROPE_THETA ** (-2 * i / cfg.head_dim)
        for weight in (attn.q_proj.weight, attn.k_proj.weight):
            weight[[i, i + half]] = 0.0
        attn.q_proj.weight[i, _CONSTANT_DIM] = math.cos(theta)
        attn.q_proj.weight[i + half, _CONSTANT_DIM] = -math.sin(theta)
        attn.k_proj.weight[i, _CONSTANT_DIM] = 1.0


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
