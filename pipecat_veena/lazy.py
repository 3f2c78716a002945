"""Public names of a package imported on first use (PEP 562).

Importing a package face stays cheap: ``pipecat_veena`` loads no Pipecat or vLLM, and
``pipecat_veena.engine`` no codec.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_names(package: str, public: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each public name on first use.

    Args:
        package: the package's dotted name (its ``__name__``).
        public: name -> the module that defines it, absolute (``pipecat_veena.x``) or relative to
            ``package`` (``"core"``).
    """

    def __getattr__(name: str) -> Any:
        where = public.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = where if where.startswith("pipecat_veena") else f"{package}.{where}"
        return getattr(import_module(module), name)

    return __getattr__
