"""Every benchmark script imports: a helper renamed elsewhere must not break a script that only
``make bench`` runs (benchmarks.ray_serve once imported a percentile helper that had moved)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
MODULES = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_benchmark_module_imports(name):
    importlib.import_module(f"benchmarks.{name}")
