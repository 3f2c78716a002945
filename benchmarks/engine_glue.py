"""Glue cost: CPU microseconds per generated token spent outside the LLM and the codec.

The engine runs its real path (prompt building, parser, repetition guard, StreamDecoder
scheduling and stitching, DecodeBatcher thread hop, int16 conversion, async generator layers)
over a generator that replays a recorded-shape token stream instantly and a codec that returns
zeros instantly. The replaying generator's own cost is measured alone and subtracted.

    .venv/bin/python -m benchmarks.engine_glue
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids  # noqa: E402

from benchmarks._report import update_section  # noqa: E402
from pipecat_veena.engine import EngineConfig, VeenaEngine  # noqa: E402
from pipecat_veena.streaming.schedule import _DEFAULTS, StreamConfig  # noqa: E402

IDS = spark_ids()
BICODEC_STREAM = StreamConfig(**_DEFAULTS["BiCodecCodec"])


class NullCodec(FakeBiCodec):
    """Instant BiCodec-shaped codec: zeros of the right length (measures no codec work)."""

    def decode_windows(self, windows):
        return [np.zeros(w.kept_frames * self.samples_per_frame, np.float32) for w in windows]


def _script(semantics: int):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 8192, semantics)

    def script(prompt, options):
        head = [IDS.marker("start_global_token"), *IDS.global_ids(range(32)),
                IDS.marker("end_global_token"), IDS.marker("start_semantic_token")]  # fmt: skip
        return head + [IDS.semantic_base + int(c) for c in codes] + [IDS.eos]

    return script


async def _generator_alone(semantics: int) -> tuple[float, int]:
    gen = ScriptedGenerator(_script(semantics), step=1)
    from pipecat_veena.generation import SamplingOptions

    opts = SamplingOptions(max_tokens=10**6, stop_token_ids=(IDS.eos,))
    start = time.process_time()
    count = 0
    async for delta in gen.generate([1, 2, 3], opts, "r"):
        count += len(delta.token_ids)
    return time.process_time() - start, count


async def _engine_run(root: Path, semantics: int, text: str) -> tuple[float, int, float]:
    gen = ScriptedGenerator(_script(semantics), step=1)
    engine = VeenaEngine(
        EngineConfig(
            checkpoint=root,
            warmup=False,
            pin_voices=False,
            max_part_chars=100_000,
            stream=BICODEC_STREAM,  # the schedule a BiCodec checkpoint gets
        ),
        generator=gen,
        codec=NullCodec(),
    )
    await engine.start()
    start = time.process_time()
    samples = 0
    tokens = 0
    async for chunk in engine.stream(text):
        samples += chunk.num_samples
        tokens = chunk.tokens
    cpu = time.process_time() - start
    await engine.shutdown()
    return cpu, tokens, samples / 16000


async def main(seconds: list[int], write: bool) -> str:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = make_checkpoint(Path(tmp))
        await _engine_run(root, 250, "word " * 5)  # warm-up (first-call costs are not glue)
        for secs in seconds:
            semantics = secs * 50
            text = "word " * secs  # one part, long enough for the runaway cap (0.25 s/char)
            engine_cpu, tokens, audio = await _engine_run(root, semantics, text.strip())
            gen_cpu, gen_tokens = await _generator_alone(semantics)
            glue_us = (engine_cpu - gen_cpu) / tokens * 1e6
            rows.append((secs, tokens, audio, engine_cpu * 1e3, gen_cpu * 1e3, glue_us))
    table = [
        "| utterance | tokens | audio s | engine CPU ms | replay alone ms | glue µs/token |",
        "|---|---|---|---|---|---|",
        *(
            f"| {s} s | {t} | {a:.1f} | {e:.1f} | {g:.1f} | **{u:.1f}** |"
            for s, t, a, e, g, u in rows
        ),
    ]
    body = "\n".join(table) + (
        "\n\nTarget: <= 20 µs per generated token outside the LLM and the codec (one token per "
        "delta, as vLLM streams). Includes prompt building, parsing, the loop guard, window "
        "scheduling and stitching, the decode batcher's thread hop and int16 conversion."
    )
    if write:
        update_section("engine_glue", "Engine glue cost", "python -m benchmarks.engine_glue", body)
    return body


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, nargs="+", default=[5, 20, 60])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    print(asyncio.run(main(args.seconds, not args.no_write)))
