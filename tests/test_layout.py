"""The package's layers, checked from the source: who may import whom (docs/layout.md).

Every ``import`` of the package, at any depth (a function's lazy import included), is read with
``ast``; each module belongs to one layer, and a layer may import only the layers below it. The
layers are the folders, so a new module inherits its folder's rules.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pipecat_veena"
BASICS = {
    "interface", "errors", "audio", "resample", "tasks", "text", "logs", "lazy", "tracing",
    "__init__",
}  # fmt: skip
FRONT_DOORS = {"service", "livekit", "engine_thread", "wav_sink", "cli", "__main__"}
FRAMEWORKS = ("pipecat", "livekit", "fastapi", "starlette", "uvicorn", "ray")

#: layer -> the layers it may import (itself always allowed). "engine" is the engine's public
#: face (``pipecat_veena.engine``); "engine.*" its insides.
ALLOWED: dict[str, set[str]] = {
    "basics": set(),
    "normalize": {"basics"},
    "timing": {"basics", "normalize"},
    "word_stream": {"basics", "normalize", "timing"},
    "codecs": {"basics"},
    "generation": {"basics"},
    "streaming": {"basics", "codecs"},
    "engine.*": {
        "basics",
        "normalize",
        "timing",
        "word_stream",
        "codecs",
        "streaming",
        "generation",
        "engine",
    },
    "remote": {"basics", "generation", "normalize", "engine"},
    "server": {"basics", "remote", "engine", "normalize", "generation"},
    "deploy": {"basics", "server", "engine", "demo"},
    "demo": {"basics", "codecs", "engine", "generation"},
    "front": {"*"},
}


def layer_of(module: str) -> str:
    """The layer of a dotted module name below ``pipecat_veena``."""
    parts = module.split(".")[1:]
    if not parts or (len(parts) == 1 and parts[0] in BASICS):
        return "basics"
    head = parts[0]
    if head in FRONT_DOORS:
        return "front"
    if head == "engine":
        return "engine" if len(parts) == 1 or parts[1] == "__init__" else "engine.*"
    return head


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts) if len(parts) > 1 else "pipecat_veena.__init__"
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "static" not in p.parts)


def test_every_layer_imports_only_the_layers_below_it():
    wrong = []
    for path in modules():
        me = module_name(path)
        mine = layer_of(me)
        allowed = ALLOWED[mine if mine != "engine" else "basics"] | {mine, "basics"}
        if mine == "engine":  # the public face re-exports the insides
            allowed |= {"engine.*"}
        for line, target in imports(path):
            if not target.startswith("pipecat_veena"):
                continue
            theirs = layer_of(target)
            if "*" in allowed or theirs in allowed:
                continue
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            wrong.append(f"{where} ({mine}) imports {target} ({theirs})")
    assert not wrong, "imports against the layering of docs/layout.md:\n" + "\n".join(wrong)


def test_the_engine_and_below_import_no_framework():
    engine_side = (
        "engine", "engine.*", "streaming", "generation", "codecs", "normalize", "timing",
        "word_stream", "basics",
    )  # fmt: skip
    wrong = [
        f"{p.relative_to(ROOT.parent)}:{line} imports {target}"
        for p in modules()
        if layer_of(module_name(p)) in engine_side
        for line, target in imports(p)
        if target.split(".")[0] in FRAMEWORKS
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_between_modules():
    """No two modules (or longer rings) import each other, inside a package too: every import
    counts, TYPE_CHECKING blocks and a function's lazy import included (a lazy import that
    closes a ring is still a circle between the modules' designs: loading has one direction)."""
    graph: dict[str, set[str]] = {}
    names = {module_name(p): p for p in modules()}
    for me, path in names.items():
        graph[me] = set()
        for _, target in imports(path):
            # "from pipecat_veena.x import y" may name a submodule y: the module is enough here.
            while target and target not in names and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in names and target != me and not me.startswith(target + "."):
                graph[me].add(target)
    # Package faces (``__init__``) re-export their insides: an edge into a package face from
    # its own insides is the only cycle that is not a design smell, so skip faces as sources.
    faces = {n for n, p in names.items() if p.name == "__init__.py"}
    cycles = []
    for start in graph:
        if start in faces:
            continue
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt in faces:
                    continue
                if nxt == start:
                    cycles.append(" -> ".join([*path, start]))
                elif nxt not in path and len(path) < 6:
                    stack.append((nxt, [*path, nxt]))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles)))


@pytest.mark.parametrize(
    "module, heavy",
    [
        ("pipecat_veena.remote", ("torch", "vllm", "pipecat_veena.engine.core", "opentelemetry")),
        ("pipecat_veena.engine", ("torch", "vllm", "pipecat", "opentelemetry")),
        ("pipecat_veena", ("torch", "vllm", "pipecat", "fastapi")),
    ],
)
def test_light_imports_stay_light(module: str, heavy: tuple[str, ...]):
    code = f"import sys, {module}; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {module} loaded {out.stdout.strip()}"


#: Every name the README, docs/ and examples/ import, from where they import it.
DOCUMENTED = {
    "pipecat_veena": [
        "VeenaEngine", "EngineConfig", "VeenaTTSService", "RemoteVeenaEngine", "StreamConfig",
        "StreamDecoder", "SpeechEngine", "AudioChunk", "build_demo_checkpoint",
    ],
    "pipecat_veena.engine": ["VeenaEngine", "EngineConfig", "AudioChunk"],
    "pipecat_veena.remote": ["RemoteVeenaEngine"],
    "pipecat_veena.livekit": ["VeenaTTS"],
    "pipecat_veena.service": ["VeenaTTSService"],
    "pipecat_veena.engine_thread": ["EngineThread"],
    "pipecat_veena.normalize": ["normalize"],
    "pipecat_veena.timing": ["align_words"],
    "pipecat_veena.demo": ["build_demo_checkpoint"],
    "pipecat_veena.wav_sink": ["say_to_wav"],
    "pipecat_veena.server": ["create_app", "ServerHandle", "ServerSettings"],
    "pipecat_veena.interface": ["SpeechEngine"],
    "pipecat_veena.resample": ["StreamResampler"],
    "pipecat_veena.logs": ["configure_logging"],
    "pipecat_veena.remote.protocol": ["parse_client_message", "parse_server_message"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_documented_import_paths_work(module: str):
    imported = importlib.import_module(module)
    missing = [name for name in DOCUMENTED[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_the_documented_imports_are_the_ones_checked():
    """Every ``from pipecat_veena... import`` in the README, docs/ and examples/ is listed above."""
    root = ROOT.parent
    texts = [root / "README.md", *root.glob("docs/*.md"), *root.glob("examples/**/*.py")]
    pattern = re.compile(r"from (pipecat_veena[\w.]*) import (\([^)]*\)|[\w, ]+)")
    unlisted = [
        f"{path.name}: {module}.{name}"
        for path in texts
        for module, names in pattern.findall(path.read_text())
        for name in (n.strip() for n in names.strip("()").replace("\n", " ").split(","))
        if name and name not in DOCUMENTED.get(module, ())
    ]
    assert not unlisted, "documented imports not checked here: " + ", ".join(unlisted)
