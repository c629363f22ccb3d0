"""The package's imports flow one way (design.md): no import circle, nothing below the CLI
imports `sempar.cli` or `sempar.commands`, and each stage of the data flow imports only stages
to its left (`LAYERS`). Function-local imports count as imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
TOP = ("sempar.cli", "sempar.commands", "sempar.__main__")   # __main__: `python -m sempar`
# The data flow of design.md, left to right: trace -> affinity (predictors in predict/) ->
# placement -> schedule -> comm / runtime -> report; the testbed, the serving and chiplet
# simulators, the exports and the bench's orchestration build on them (the exports, which
# need only placements, before serving: `plan` asks the exporter whether its command runs). Modules outside this
# list (errors, atomic, registry, paths, models, console, tiny, corpus, ...) are shared tools.
LAYERS = ("trace", "affinity", "predict", "placement", "schedule", "comm", "report", "routing",
          "runtime", "testbed", "export", "serving", "chiplet", "bench")


def _modules() -> dict[str, Path]:
    mods = {}
    for f in (SRC / "sempar").rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = f
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that `name` imports anywhere in its file (resolved to modules)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # `from pkg import sub` imports the submodule; `from pkg import name`, the package
            targets = subs if all(t in known for t in subs) else subs + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:        # `from pkg import name` names an attribute
                t = t.rpartition(".")[0]
            if t and t != name and t != "sempar":
                out.add(t)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, f, set(mods)) for m, f in mods.items()}


def test_no_import_circle(graph):
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                pytest.fail("import circle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_nothing_below_imports_the_cli(graph):
    below = {m: sorted(d for d in deps if d.startswith(TOP))
             for m, deps in graph.items() if not m.startswith(TOP)}
    assert {m: d for m, d in below.items() if d} == {}


def test_each_stage_imports_only_stages_to_its_left(graph):
    def stage(m: str) -> str:
        parts = m.split(".")
        return parts[1] if len(parts) > 1 else ""

    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() if stage(m) in LAYERS
                 for d in deps if stage(d) in LAYERS
                 and LAYERS.index(stage(d)) > LAYERS.index(stage(m)))
    assert bad == []


def test_every_imported_name_exists():
    """`from sempar.x import name` anywhere in the package (function-local imports too) names
    something sempar.x has: a moved function breaks here, not in the one code path that
    imports it lazily."""
    import importlib

    missing = []
    for name, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and not node.level
                    and (node.module or "").startswith("sempar")):
                continue
            mod = importlib.import_module(node.module)
            for a in node.names:
                if a.name != "*" and not hasattr(mod, a.name):
                    try:
                        importlib.import_module(f"{node.module}.{a.name}")
                    except ImportError:
                        missing.append(f"{name}:{node.lineno} {node.module}.{a.name}")
    assert missing == []
