"""Run every CPU benchmark in turn (each writes its own section of BENCHMARKS.md).

    .venv/bin/python -m benchmarks.run_all        (or: make bench)

Each runs in its own process, one after the other, so that timings do not compete for the two
cores and every vLLM engine is gone before the next starts. benchmarks/gpu_codec.py needs a GPU
and is not run here.
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = [
    ["benchmarks.normalize"],
    ["benchmarks.pronunciation"],
    ["benchmarks.demo"],
    ["benchmarks.codec_cpu"],
    ["benchmarks.codec_cpu", "--streamed"],
    ["benchmarks.codec_cpu", "--parts"],
    ["benchmarks.codec_compile"],
    ["benchmarks.streaming"],
    ["benchmarks.engine_glue"],
    ["benchmarks.resample"],
    ["benchmarks.speed"],
    ["benchmarks.encode"],
    ["benchmarks.grammar"],
    ["benchmarks.service", "--kind", "spark-tiny", "--concurrency", "1", "4", "16"],
    ["benchmarks.service", "--kind", "spark", "--concurrency", "1", "4"],
    ["benchmarks.threads"],
    ["benchmarks.serve"],
    ["benchmarks.engine_restart"],
    ["benchmarks.playground"],
    ["benchmarks.upload_attack"],
    ["benchmarks.load", "--spawn-server", "spark-tiny", "--concurrency", "1", "4", "16",
     "--duration", "40", "--report", "load_server", "--no-progress",
     "--title", "Load harness on one server (pipecat-veena serve, spark-tiny, CPU)"],
    ["benchmarks.ray_serve"],
]  # fmt: skip


def main() -> int:
    """Run each benchmark; returns the number that failed."""
    failed = 0
    for args in BENCHMARKS:
        print(f"== python -m {' '.join(args)}", flush=True)
        failed += subprocess.run([sys.executable, "-m", *args]).returncode != 0
    return failed


if __name__ == "__main__":
    sys.exit(main())
