"""Writes one benchmark's section of BENCHMARKS.md, leaving the other sections as they are."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import re
from collections.abc import Callable
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
_HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by the script it names; rerun that command to refresh it. "
    "CPU figures come from the 2-core CI-class machine unless a section says otherwise; "
    "timings are noisy there, so compare ratios within one run.\n"
)


def machine_line() -> str:
    """One line describing where the figures were measured."""
    import torch

    cpu = platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{_dt.date.today().isoformat()}, {os.cpu_count()} CPU cores ({cpu}), {gpu}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} torch threads"
    )


def update_section(name: str, title: str, command: str, body: str) -> Path:
    """Replace (or append) the section ``name`` of BENCHMARKS.md.

    Args:
        name: stable key of the section (e.g. "codec_cpu").
        title: the section heading.
        command: the shell command that reproduces the figures.
        body: Markdown with the figures (tables, notes).

    Returns:
        The path of BENCHMARKS.md.
    """
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    section = (
        f"{start}\n## {title}\n\n"
        f"Reproduce: `{command}`  \nMeasured: {machine_line()}\n\n{body.strip()}\n{end}"
    )
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else _HEADER
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    BENCHMARKS_MD.write_text(text)
    return BENCHMARKS_MD


def publish(name: str, title: str, command: str, body: str | list[str], write: bool) -> None:
    """Print a benchmark's figures (text, or its lines) and, with ``write``, put them in
    BENCHMARKS.md as section ``name``."""
    body = body if isinstance(body, str) else "\n".join(body) + "\n"
    print(body)
    if write:
        update_section(name, title, command, body)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cli(doc: str, main: Callable[[bool], str]) -> None:
    """Run a benchmark whose ``main(write)`` takes no options but ``--no-write``; print it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print, leave BENCHMARKS.md")
    print(main(not parser.parse_args().no_write))
