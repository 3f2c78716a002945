"""What holding every stream to its codec grammar costs: the logits processor alone per step, and
vLLM's token rate with and without it (the same prompts and seeds, rounds interleaved so that
machine noise hits both alike).

    .venv/bin/python -m benchmarks.grammar [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from contextlib import aclosing
from dataclasses import replace
from types import SimpleNamespace

import torch

from benchmarks._report import update_section
from pipecat_veena.demo import build_demo_checkpoint
from pipecat_veena.engine import Voice, detect_layout
from pipecat_veena.engine.formats import load_format, load_tokenizer
from pipecat_veena.generation.vllm_grammar import EXTRA_ARGS_KEY, GrammarLogitsProcessor
from pipecat_veena.generation.vllm_local import VllmGenerator

SPARK_VOCAB = 166_000  # Spark-TTS-0.5B's padded vocabulary: the real per-step mask width
TEXT = "The meeting starts at ten, in room twelve. Please bring your notes and a pen."


def _processor_cost(fmt, batch: int, steps: int = 200) -> float:
    """Microseconds per decoding step of the processor alone (CPU torch, float32 logits)."""
    grammar = fmt.grammar(Voice("female", gender=0), prefilled=True)
    params = SimpleNamespace(extra_args={EXTRA_ARGS_KEY: grammar.to_spec()})
    processor = GrammarLogitsProcessor(None, torch.device("cpu"), False)
    outputs = [[] for _ in range(batch)]
    added = [(i, params, None, outputs[i]) for i in range(batch)]
    processor.update_state(SimpleNamespace(removed=[], added=added, moved=[]))
    logits = torch.zeros(batch, SPARK_VOCAB)
    processor.apply(logits)  # builds the bias table once
    start = time.perf_counter()
    for step in range(steps):
        for out in outputs:
            out.append(fmt.ids.semantic_base + step % 8192)
        processor.apply(logits)
    return (time.perf_counter() - start) / steps * 1e6


async def _rate(generator, prompt, options, streams: int) -> float:
    """Generated tokens per second over ``streams`` concurrent requests."""

    async def one(i: int) -> int:
        count = 0
        opts = replace(options, seed=i)
        stream = generator.generate(prompt, opts, f"bench-{time.monotonic_ns()}-{i}")
        async with aclosing(stream) as deltas:
            async for delta in deltas:
                count += len(delta.token_ids)
        return count

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(streams)))
    return sum(counts) / (time.perf_counter() - start)


async def main(rounds: int, write: bool) -> str:
    """Measure and (optionally) write the BENCHMARKS.md section."""
    root = build_demo_checkpoint("spark-tiny")
    layout = detect_layout(root)
    fmt = load_format(layout, load_tokenizer(layout.llm_dir), 32)
    voice = Voice("female", gender=0)
    prompt = fmt.prompt(TEXT, voice, None)
    base = fmt.options(fmt.default_sampling, TEXT, voice, prefilled=False, rate=50.0)
    base = replace(base, min_tokens=400, max_tokens=400)  # equal work in both arms
    arms = {"off": replace(base, grammar=None), "on": base}
    lines = [
        "The processor alone, per decoding step, Spark's 166,000-id vocabulary, CPU float32:",
        "",
        "| batch | us per step |",
        "|---|---|",
    ]
    for batch in (1, 8, 64):
        lines.append(f"| {batch} | {_processor_cost(fmt, batch):.0f} |")
    generator = VllmGenerator(layout.llm_dir, max_model_len=2048, max_num_seqs=16)
    await generator.start()
    rates: dict[tuple[str, int], list[float]] = {}
    try:
        for streams in (1, 8):
            for _ in range(rounds):
                for arm, options in arms.items():
                    rate = await _rate(generator, prompt, options, streams)
                    rates.setdefault((arm, streams), []).append(rate)
    finally:
        await generator.shutdown()
    lines += [
        "",
        f"vLLM CPU on the spark-tiny demo LLM (vocabulary {fmt.ids.semantic_base + 8192 + 500:,}"
        f" ids), 400 tokens per stream, median of {rounds} interleaved rounds:",
        "",
        "| concurrent streams | tokens/s without grammar | with grammar | ratio |",
        "|---|---|---|---|",
    ]
    for streams in (1, 8):
        off = statistics.median(rates["off", streams])
        on = statistics.median(rates["on", streams])
        lines.append(f"| {streams} | {off:.0f} | {on:.0f} | {on / off:.2f} |")
    body = "\n".join(lines)
    if write:
        update_section(
            "grammar",
            "Grammar-constrained decoding: cost",
            f"python -m benchmarks.grammar --rounds {rounds}",
            body,
        )
    return body


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    print(asyncio.run(main(args.rounds, not args.no_write)))
