"""The package's layers point one way: a module imports only from its own layer or those below.

config -> io, model -> runtime -> wire -> engine -> rag -> roles -> launch -> entry points
(report, plan, run -> api, __main__, status -> the package itself).
Read from the source (``ast``), so lazy imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "pipeline"

LAYERS = {
    "config": 0, "io": 1, "model": 1, "runtime": 2, "wire": 3, "engine": 4, "rag": 5, "roles": 6,
    "launch": 7,
    # entry points: the run report is written by run at the end of a run, and pools=auto is
    # planned by run at its start
    "report": 8, "preflight": 8, "run": 8, "plan": 8, "api": 9, "__main__": 9, "status": 9, "__init__": 10,
}


def _layer(module: str) -> str:
    """``pipeline.engine.build`` -> ``engine``; ``pipeline`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            out += [(node.lineno, n) for n in names if n.startswith("pipeline")]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("pipeline")]
    return out


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts)


def test_every_package_has_a_layer():
    tops = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
            if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert tops <= set(LAYERS), f"give these a layer in LAYERS: {sorted(tops - set(LAYERS))}"


def test_nothing_imports_upward():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        me = _module(path)
        mine = LAYERS[_layer(me)]
        for line, target in _imports(path):
            layer = _layer(target)
            if layer in LAYERS and LAYERS[layer] > mine:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target} ({layer} is above {_layer(me)})")
    assert not upward, "\n".join(upward)


def test_no_file_over_400_lines():
    long = [f"{p.relative_to(ROOT.parent)}: {n}" for p in sorted(ROOT.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 400]
    assert not long, long
