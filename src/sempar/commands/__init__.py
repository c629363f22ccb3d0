"""More `sempar` verbs, one module each, so cli.py stays the entry point and not a catalogue.

Every module here defines `register(app: typer.Typer) -> None`, adding its command(s) to the
main app; `register_all` imports them in name order. Use `sempar.cli.emit_json` for `--json`
and raise `sempar.errors.InputError` for bad input (one line, exit code 2).
"""

from __future__ import annotations

import importlib
import pkgutil


def register_all(app) -> None:
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{mod}").register(app)
