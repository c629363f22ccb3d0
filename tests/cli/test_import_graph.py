"""The package's imports flow one way (design.md): no import circle, nothing below the CLI
imports `sempar.cli` or `sempar.commands`, and each stage of the data flow imports only stages
to its left (`LAYERS`). Function-local imports count as imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
TOP = ("sempar.cli", "sempar.commands", "sempar.__main__")   # __main__: `python -m sempar`
# The data flow of design.md, left to right: trace (capture/ writes traces from a running
# engine, so it sits right after) -> affinity (mergeable statistics in stats/, predictors in
# predict/) ->
# placement -> schedule -> comm / runtime -> report; the testbed, the serving and chiplet
# simulators, the exports and the bench's orchestration build on them (the HTTP router runs the
# request policies of schedule/ on placements, and `plan` prints its command; the exports, which
# need only placements, before serving: `plan` asks the exporter whether its command runs; the
# engine-balancer plug-in, eplb/, which the drift replay runs as a policy, after them; the
# demo, which runs every stage into one report, last). Modules outside this
# list (errors, atomic, registry, paths, models, console, tiny, corpus, ...) are shared tools.
LAYERS = ("trace", "capture", "affinity", "stats", "predict", "placement", "schedule", "comm", "report",
          "costroute", "runtime", "testbed", "router", "export", "eplb", "serving", "calibrate", "drift",
          "chiplet", "bench", "demo")


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


def _find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (module -> modules it imports), None when there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circle(graph):
    circle = _find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_no_import_circle_among_benchmarks():
    """The benchmark scripts import each other by bare name (benchmarks/ on sys.path); shared
    figures live in a small module both import, never in one of the scripts."""
    bench = SRC.parent / "benchmarks"
    names = {f.stem for f in bench.glob("*.py")}
    graph = {}
    for f in bench.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                deps.add(node.module.split(".")[0])
        graph[f.stem] = {d for d in deps if d in names and d != f.stem}
    assert graph, bench
    assert _find_circle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]     # the check can fail
    circle = _find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


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


# Packages that are tools shared by every stage rather than a stage of the data flow.
SHARED_PACKAGES = ("commands", "corpus", "tiny")


def test_every_package_has_a_place():
    """A new package is put in LAYERS (where the data flow says) or named a shared tool."""
    pkgs = {p.name for p in (SRC / "sempar").iterdir() if (p / "__init__.py").is_file()
            or (p.is_dir() and any(p.glob("*.py")))}
    assert sorted(pkgs - set(LAYERS) - set(SHARED_PACKAGES)) == []
