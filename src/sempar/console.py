"""Output of the `sempar` verbs: `out` (stdout tables), `err` (stderr), `emit_json` for `--json`,
`note` (one line on stderr, once) and `warnings_as_note` (a library's warnings as such a note).

A low module (rich, json, numpy only) so that the verbs in `sempar.commands` and anything else
that prints for the command line share one console without importing `sempar.cli`."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import warnings
from typing import Any, Iterator

from rich.console import Console

err = Console(stderr=True)
out = Console()
if not out.is_terminal:         # piped or logged: rich's 80 columns would squeeze the tables
    out = Console(width=160)


def json_default(o: Any) -> Any:
    """`json.dumps(default=...)` for numpy scalars and arrays; anything else is a TypeError."""
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, +-Infinity; numpy's too) replaced by None, dicts,
    lists and tuples rebuilt, numpy arrays as lists: what JSON can say (RFC 8259 has no NaN)."""
    import numpy as np

    if isinstance(obj, float):          # np.float64 is a float
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return finite(obj.tolist())
    if isinstance(obj, np.floating):
        return finite(float(obj))
    return obj


def json_text(obj: Any, indent: int | None = 1) -> str:
    """The one JSON writer of sempar's reports (`--json`, analysis.json, summary.json, bench
    results): strict JSON, non-finite numbers written as null (`finite`)."""
    return json.dumps(finite(obj), indent=indent, default=json_default, allow_nan=False)


def emit_json(obj: Any) -> None:
    """Print `obj` as the one JSON object of `--json` on stdout (indent 1; NaN and Infinity as
    null, `json_text`) and flush."""
    sys.stdout.write(json_text(obj) + "\n")
    sys.stdout.flush()


_noted: set[str] = set()


def note(key: str, message: str) -> None:
    """`note: message` as one line on stderr, the first time `key` is noted in this process."""
    if key in _noted:
        return
    _noted.add(key)
    err.print(f"note: {message}", markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def warnings_as_note(category: type[Warning], what: str) -> Iterator[None]:
    """Inside, warnings of `category` (a library's, e.g. scikit-learn's ConvergenceWarning) are
    not printed raw: the first of the process becomes one line `note: {what}: {its message}`
    (`note`, keyed by the category: one cause, e.g. duplicate points, reaches several solvers);
    other warnings are shown as before."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", category)
        shown = warnings.showwarning

        def show(message, cat, filename, lineno, file=None, line=None):  # noqa: ANN001
            if issubclass(cat, category):
                note(f"{cat.__module__}.{cat.__qualname__}",
                     f"{what}: {' '.join(str(message).split())} (from "
                     f"{cat.__module__.split('.')[0]}; later ones not shown)")
            else:
                shown(message, cat, filename, lineno, file, line)

        warnings.showwarning = show
        yield
