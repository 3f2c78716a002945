"""Whether to torch.compile the streaming codec on CPU: compile cost against what it saves.

Streams three 5 s utterances (different tokens) through ``StreamDecoder`` on the real BiCodec
config (random *project* weights, bfloat16: the CPU default where the probe picks it), once
eager and once with ``torch.compile(dynamic=True)`` on the decoder's forward, in a fresh
inductor cache (``TORCHINDUCTOR_CACHE_DIR``, as on a new machine). Wall time per utterance: the
compiled path's first utterance pays the compiles (every new window shape the crop points
produce may add one).

    .venv/bin/python -m benchmarks.codec_compile
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

from loguru import logger

from benchmarks._report import publish

COMMAND = ".venv/bin/python -m benchmarks.codec_compile"
SECONDS = 5
UTTERANCES = 3


def _stream(codec, seed: int) -> tuple[float, int]:
    """Wall seconds to decode one streamed utterance, and its number of codec calls."""
    from benchmarks.codec_cpu import _tokens
    from pipecat_veena.streaming import StreamDecoder

    steps = SECONDS * 50
    sem, glob = _tokens(1, steps, seed=seed)
    decoder = StreamDecoder(codec, condition=glob[0].numpy())
    tokens, wall, calls = sem[0].tolist(), 0.0, 0
    for step in range(steps + 1):
        for job in decoder.plan([tokens[step]]) if step < steps else decoder.plan_finish():
            start = time.perf_counter()
            audio = codec.decode_windows([job.window])[0]
            wall += time.perf_counter() - start
            calls += 1
            decoder.accept(job, audio)
    return wall, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        import torch._dynamo

        from benchmarks.streaming import _bicodec
        from pipecat_veena.codecs.bicodec import BiCodecCodec

        torch.set_num_threads(2)
        eager = BiCodecCodec(_bicodec("project").decoder.to(torch.bfloat16))
        compiled = BiCodecCodec(copy.deepcopy(eager.decoder))
        compiled.decoder.forward = torch.compile(compiled.decoder.forward, dynamic=True)
        rows = []
        for name, codec in (("eager", eager), ("torch.compile(dynamic=True)", compiled)):
            for i in range(UTTERANCES):
                wall, calls = _stream(codec, seed=200 + i)
                rows.append((name, i + 1, wall, calls))
                logger.info(f"{name}: utterance {i + 1}: {wall:.2f} s, {calls} codec calls")
        graphs = torch._dynamo.utils.counters["stats"].get("unique_graphs", 0)
    lines = [
        f"{UTTERANCES} streamed utterances of {SECONDS} s each (default schedule, real config, "
        "bfloat16, 2 threads), wall time inside codec calls; fresh inductor cache.",
        "",
        "| decoder | utterance | wall | codec calls | per audio second |",
        "|---|---|---|---|---|",
    ]
    for name, i, wall, calls in rows:
        lines.append(f"| {name} | {i} | {wall:.2f} s | {calls} | {1000 * wall / SECONDS:.0f} ms |")
    eager_warm = min(w for n, i, w, _ in rows if n == "eager")
    comp = [w for n, i, w, _ in rows if n != "eager"]
    saved = eager_warm - min(comp[1:])
    lines += [
        "",
        f"Graphs compiled: {graphs}. The first compiled utterance costs {comp[0]:.1f} s against "
        f"{eager_warm:.1f} s eager; later ones {min(comp[1:]):.2f} s (saving {saved:.2f} s per "
        f"{SECONDS} s of audio), so "
        + (
            f"compiling pays back only after about "
            f"{(comp[0] - eager_warm) / saved * SECONDS / 60:.0f} minutes of audio"
            if saved > 0
            else "compiling never pays back here (no saving once compiled)"
        )
        + "; every new window shape may compile again.",
    ]
    title = "torch.compile for the streaming codec on CPU"
    publish("codec_compile", title, COMMAND, lines, not args.no_write)


if __name__ == "__main__":
    main()
