"""The `sempar` verbs, one module each; `sempar.cli` only builds the app and calls `register_all`.

Every module here (a package for the demo) defines `register(app: typer.Typer) -> None`, adding
its command or command group to the main app. Verbs print through `sempar.console` (`out`, `err`,
`emit_json` for `--json`) and raise `sempar.errors.InputError` for bad input (one line, exit code
2). Modules whose name starts with `_` hold helpers shared by the verbs and register nothing.
"""

from __future__ import annotations

import importlib
import pkgutil

# The order of `sempar --help` (commands first, then command groups, each in registration
# order); verbs not named here follow in name order.
ORDER = ("train_tiny", "synth", "record", "capture", "place", "export", "evaluate", "analyze", "demo",
         "trace", "corpus", "importers")


def register_all(app) -> None:
    found = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    for mod in [m for m in ORDER if m in found] + [m for m in found if m not in ORDER]:
        importlib.import_module(f"{__name__}.{mod}").register(app)
