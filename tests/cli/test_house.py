"""House rules checked on the source: no function in `src` takes more than MAX_PARAMS
parameters (options are passed whole, as `SolveOptions`, `WorkloadSpec`, `SLOSpec`,
`PlanOptions` are), and neither the benchmarks nor the demo import the CLI's verb modules
(`sempar.commands`): library code lives below the CLI.

Exempt from the parameter count: numba kernels (a jitted function's arrays are its
arguments: no object can be passed into one), and the CLI verbs themselves, whose parameters
are their command-line options one by one (typer reads a verb's signature)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "sempar"
MAX_PARAMS = 12


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    n += (a.vararg is not None) + (a.kwarg is not None)
    if a.args and a.args[0].arg in ("self", "cls"):
        n -= 1
    return n


def _jitted(fn) -> bool:
    """Decorated by numba (`njit`, `jit`, or a module alias of them such as `_jit`)."""
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def _verbs(tree: ast.Module) -> set[str]:
    """Functions a typer app registers as commands: `@app.command(...)` or
    `app.command(...)(name)`."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                and d.func.attr in ("command", "callback") for d in n.decorator_list):
            out.add(n.name)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Call) \
                and isinstance(n.func.func, ast.Attribute) and n.func.func.attr == "command":
            out.update(a.id for a in n.args if isinstance(a, ast.Name))
    return out


def long_signatures(root: Path) -> list[str]:
    bad = []
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        verbs = _verbs(tree) if "commands" in f.relative_to(root).parts else set()
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and _count(n) > MAX_PARAMS and not _jitted(n) and n.name not in verbs:
                bad.append(f"{f.relative_to(root.parent)}:{n.lineno} {n.name} ({_count(n)})")
    return bad


def test_no_function_takes_more_than_twelve_parameters():
    assert long_signatures(SRC) == []


def test_the_parameter_check_can_fail(tmp_path):
    (tmp_path / "m.py").write_text(
        "def f(" + ", ".join(f"a{i}" for i in range(13)) + "): pass\n"
        "def g(self, " + ", ".join(f"a{i}" for i in range(12)) + "): pass\n"
        "@_jit\ndef k(" + ", ".join(f"a{i}" for i in range(20)) + "): pass\n")
    assert long_signatures(tmp_path) == [f"{tmp_path.name}/m.py:1 f (13)"]


def _imports_commands(path: Path) -> list[str]:
    out = []
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([a.name for a in n.names] if isinstance(n, ast.Import)
                 else [n.module or ""] if isinstance(n, ast.ImportFrom) else [])
        out += [f"{path.name}:{n.lineno} {m}" for m in names
                if m == "sempar.commands" or m.startswith("sempar.commands.")
                or m in ("sempar.cli",)]
    return out


def test_benchmarks_and_the_demo_import_no_verb_module():
    files = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((SRC / "demo").rglob("*.py"))
    assert (SRC / "demo").is_dir()
    assert [x for f in files for x in _imports_commands(f)] == []
