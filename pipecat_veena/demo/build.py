"""Builds and caches the demo checkpoints: atomic, locked, keyed by the builder's version.

Each kind lives at ``<home>/<kind>/`` with a ``demo.json`` that records the build key (a hash of
the builder version, the training steps and the builder's code, docstrings and comments left
out). A checkpoint whose key differs is rebuilt. Builds happen in a temporary directory next to
the final one, under a file lock, and are renamed into place, so no process (pytest, the CLI)
ever sees a half-built checkpoint.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock
from loguru import logger

DEMO_KINDS = ("spark", "spark-tiny", "veena")
#: Bump when the checkpoints change in a way the source hash does not show.
BUILDER_VERSION = 1
MARKER = "demo.json"
#: Training steps of the two demo LLMs together (batches alternate between them). Trained under
#: the codec grammar (``train``), 450 steps took 32 s on a quiet 2-core machine (the whole build
#: 38-41 s; 48-55 s and 56-63 s with passive OpenMP waiting) and stop within 0.5-1.5x of the
#: asked length in 42/42 greedy and 125/126 sampled Spark streams, 28/28 and 84/84 Veena ones;
#: 400 steps: 30/42 and 107/126 Spark (BENCHMARKS.md, demo).
TRAIN_STEPS = 450
#: Both demo LLMs, trained together once: ``spark/`` and ``veena/`` (HF directories).
_LLMS = ".llms"
_BICODEC = {"spark": "real", "spark-tiny": "tiny"}
_CODEC_SEED = 7
_TRAIN_SEED = 2024
#: Spins of an idle OpenMP thread before it sleeps, on a quiet machine (``_omp_wait``): 3000
#: and 10000 trained alike fast here, 1000 a little slower.
_SPIN = 3000


def demo_home(directory: str | Path | None = None) -> Path:
    """Where demo checkpoints live: ``directory``, ``$PIPECAT_VEENA_HOME/demo`` or the cache."""
    if directory is not None:
        return Path(directory).expanduser()
    home = os.environ.get("PIPECAT_VEENA_HOME")
    if home:
        return Path(home).expanduser() / "demo"
    return Path.home() / ".cache" / "pipecat_veena" / "demo"


def _code_digest(source: str) -> bytes:
    """The code of a module without docstrings, comments or layout (they change no bytes)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def _source_hash() -> str:
    """Hash of the code that decides the demo bytes (this package, codec writers, grammar)."""
    from pipecat_veena.codecs import snac
    from pipecat_veena.codecs.bicodec import checkpoint
    from pipecat_veena.generation import grammar

    files = sorted(Path(__file__).parent.glob("*.py"))
    files += [Path(checkpoint.__file__), Path(snac.__file__), Path(grammar.__file__)]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + _code_digest(path.read_text(encoding="utf-8")))
    return digest.hexdigest()


def _build_key(name: str, steps: dict[str, int]) -> str:
    payload = json.dumps([BUILDER_VERSION, name, steps, _source_hash()], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _marker(path: str | Path) -> dict | None:
    """The ``demo.json`` of a checkpoint directory; None when there is none or it is not one."""
    try:
        marker = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _is_current(path: Path, key: str) -> bool:
    marker = _marker(path)
    return marker is not None and marker.get("key") == key


def is_demo_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a demo checkpoint: its ``demo.json`` names a demo kind.

    Demo checkpoints (``pipecat-veena build-demo``) have random weights: sound, not words.
    """
    marker = _marker(path)
    return marker is not None and marker.get("name") in DEMO_KINDS


def _cached(home: Path, name: str, key: str, force: bool, build: Callable[[Path], None]) -> Path:
    """Return ``home/name``, built by ``build(tmp_dir)`` unless current; atomic and locked."""
    final = home / name
    if not force and _is_current(final, key):
        return final
    home.mkdir(parents=True, exist_ok=True)
    with FileLock(str(home / f".{name.lstrip('.')}.lock")):
        if not force and _is_current(final, key):
            return final
        tmp = home / f".tmp-{name.lstrip('.')}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            build(tmp)
            marker = {"name": name, "key": key, "builder_version": BUILDER_VERSION}
            (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            old = home / f".old-{name.lstrip('.')}-{os.getpid()}"
            if final.exists():
                final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


class _Phases:
    """Logs how long each build phase took."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.times: dict[str, float] = {}

    def run(self, phase: str, fn: Callable[[], object]) -> None:
        start = time.perf_counter()
        fn()
        self.times[phase] = time.perf_counter() - start

    def log(self) -> None:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.times.items())
        logger.info(f"demo {self.what} built: {parts}")


def _copy_files(src: Path, dst: Path) -> None:
    """Hard-link (or copy, across file systems) the files of ``src`` into ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.iterdir()):
        if path.is_file() and path.name != MARKER:
            try:
                os.link(path, dst / path.name)  # the files are never written in place
            except OSError:
                shutil.copyfile(path, dst / path.name)


def build_demo_checkpoint(
    kind: str,
    dir: str | Path | None = None,  # noqa: A002 (the public name of the argument)
    *,
    force: bool = False,
    _steps: int | None = None,
) -> Path:
    """Build (or reuse) a demo checkpoint and return its root directory.

    Deterministic: the same builder writes the same bytes. The demo voice is random: it makes
    sound, not words.

    Args:
        kind: "spark" (Spark-TTS-0.5B layout, real-size BiCodec), "spark-tiny" (the same LLM,
            a small BiCodec) or "veena" (Veena layout: Llama LLM at the root, SNAC 24 kHz).
        dir: cache directory (default: ``$PIPECAT_VEENA_HOME/demo`` or
            ``~/.cache/pipecat_veena/demo``).
        force: rebuild even when a current build exists.
        _steps: training steps (tests use a few; the key changes with it).

    Returns:
        The checkpoint root (``<dir>/<kind>``).

    Raises:
        ValueError: for an unknown kind.
    """
    if kind not in DEMO_KINDS:
        raise ValueError(f"unknown demo kind {kind!r}; choose one of {', '.join(DEMO_KINDS)}")
    home = demo_home(dir)
    steps = {"llms": _steps or TRAIN_STEPS}
    llms = _cached(home, _LLMS, _build_key(_LLMS, steps), force, lambda t: _llms(t, steps["llms"]))
    key = _build_key(kind, steps)
    if kind == "veena":
        return _cached(home, kind, key, force, lambda t: _veena(t, llms / "veena"))
    return _cached(home, kind, key, force, lambda t: _spark(t, kind, llms / "spark"))


def _llms(tmp: Path, steps: int) -> None:
    """Run ``train_llms`` in a child process, OpenMP waiting as ``_omp_wait`` picks."""
    env = {**os.environ, **_omp_wait()}
    cmd = [sys.executable, "-m", "pipecat_veena.demo._worker", str(tmp), str(steps)]
    result = subprocess.run(cmd, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"training the demo LLMs failed (exit status {result.returncode}); see the output "
            "above. Rerun `pipecat-veena build-demo` after fixing it."
        )


def _idle_cpus(interval: float = 0.25) -> float:
    """How many CPUs stood idle (or waited on I/O) over the next ``interval`` seconds."""
    import psutil

    busy = psutil.cpu_percent(interval=interval) / 100
    return (os.cpu_count() or 1) * (1.0 - busy)


def _omp_wait(idle_cpus: Callable[[], float] = _idle_cpus) -> dict[str, str]:
    """OpenMP waiting for the training child, which reads it only at start-up.

    The child's ``THREADS`` torch threads meet at every operator. Where that many CPUs are idle
    (``idle_cpus``), they spin briefly (``GOMP_SPINCOUNT``) before sleeping: 25-30 % less
    training time than sleeping at once on a quiet 2-core machine (150 steps: 11.1-12.4 s
    against 14.9-16.1 s). Where they are not (another process busy), spinning takes a core from
    whoever holds it (100 steps beside one busy process: 19.6 s spinning, 13.8-14.0 s passive),
    so they sleep at once (``OMP_WAIT_POLICY=PASSIVE``). Either way the bytes are the same. A
    policy the caller set wins, and then the CPUs are not sampled.
    """
    from pipecat_veena.demo.train import THREADS

    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return {}
    idle = idle_cpus()
    policy = (
        {"GOMP_SPINCOUNT": str(_SPIN)} if idle >= THREADS - 0.2 else {"OMP_WAIT_POLICY": "PASSIVE"}
    )
    logger.info(f"demo LLMs: CPUs idle {idle:.1f} of {os.cpu_count()}, training with {policy}")
    return policy


def train_llms(directory: Path, steps: int) -> None:
    """Train both demo LLMs together and write them into ``directory/spark`` and ``/veena``."""
    from pipecat_veena.demo import spark, veena
    from pipecat_veena.demo.train import TrainConfig, train_lms

    phases = _Phases("LLMs")
    toks = {}
    phases.run(
        "tokenizers",
        lambda: toks.update(spark=spark.spark_tokenizer(), veena=veena.veena_tokenizer()),
    )
    tasks = [spark.spark_task(toks["spark"]), veena.veena_task(toks["veena"])]
    models = {}
    cfg = TrainConfig(steps=steps, seed=_TRAIN_SEED)
    phases.run("train", lambda: models.update(train_lms(cfg, tasks, desc="demo LLMs")))
    phases.run("write", lambda: _write_llms(models, toks, directory))
    phases.log()


def _write_llms(models: dict, toks: dict, directory: Path) -> None:
    from pipecat_veena.demo import spark, veena

    spark.save_spark_llm(models["spark"], toks["spark"], directory / "spark")
    veena.save_veena_llm(models["veena"], toks["veena"], directory / "veena")


def _spark(tmp: Path, kind: str, llm: Path) -> None:
    from tokenizers import Tokenizer

    from pipecat_veena.codecs.bicodec import write_random_checkpoint
    from pipecat_veena.demo.spark import write_spark_files

    phases = _Phases(kind)
    phases.run("copy LLM", lambda: _copy_files(llm, tmp / "LLM"))
    config = _BICODEC[kind]
    phases.run(
        f"BiCodec ({config})",
        lambda: write_random_checkpoint(tmp / "BiCodec", config, seed=_CODEC_SEED),
    )
    tok = Tokenizer.from_file(str(tmp / "LLM" / "tokenizer.json"))
    phases.run("files", lambda: write_spark_files(tmp, tok, kind=kind))
    phases.log()


def _veena(tmp: Path, llm: Path) -> None:
    from pipecat_veena.demo.veena import write_veena_files

    phases = _Phases("veena")
    phases.run("copy LLM", lambda: _copy_files(llm, tmp))
    phases.run("SNAC", lambda: write_veena_files(tmp, seed=_CODEC_SEED))
    phases.log()
