"""Output of the `sempar` verbs: `out` (stdout tables), `err` (stderr), `emit_json` for `--json`.

A low module (rich, json, numpy only) so that the verbs in `sempar.commands` and anything else
that prints for the command line share one console without importing `sempar.cli`."""

from __future__ import annotations

import json
import sys
from typing import Any

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


def emit_json(obj: Any) -> None:
    """Print `obj` as the one JSON object of `--json` on stdout (indent 1) and flush."""
    sys.stdout.write(json.dumps(obj, indent=1, default=json_default) + "\n")
    sys.stdout.flush()
