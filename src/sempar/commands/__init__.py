"""The `sempar` verbs, one module each; `sempar.cli` only builds the app and calls `register_all`.

Every module here (a package for the demo) defines `register(app: typer.Typer) -> None`, adding
its command or command group to the main app. Verbs print through `sempar.console` (`out`, `err`,
`emit_json` for `--json`) and raise `sempar.errors.InputError` for bad input (one line, exit code
2). Modules whose name starts with `_` hold helpers shared by the verbs and register nothing.
"""

from __future__ import annotations

import importlib
import pkgutil

# `sempar --help` lists the verbs in the data flow's order (design.md, Data flow: record -> fit ->
# profile -> solve -> schedulers -> simulate -> export -> run -> stream), the demo, which runs
# every stage, first. Verbs not named here follow in name order (tests/cli/test_cli_help.py
# asks every verb to be named).
ORDER = (
    "demo",                                                          # every stage, default data
    "corpus", "train-tiny", "record", "capture", "import", "synth",  # routing traces
    "trace", "drift",                                                # ... inspected, reordered
    "stats", "analyze",                                              # statistics, affinity
    "profile", "testbed", "calibrate",                               # topology, accelerator
    "place", "evaluate", "rebalance", "replay",                      # placement (and re-placement)
    "router",                                                        # request scheduling
    "simulate", "cost-route",                                        # communication simulation
    "serve-sim", "plan",                                             # serving forecast
    "export",                                                        # engine files, checkpoints
    "bench",                                                         # real EP execution
    "stream",                                                        # FSE-DP chiplets
)


def ordered(names) -> list[str]:
    """`names` (verbs) in ORDER, the unnamed ones after, in name order."""
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(names, key=lambda n: (rank.get(n, len(ORDER)), n))


def register_all(app) -> None:
    """Every verb module's `register(app)`, in module-name order (the help's order is ORDER's)."""
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
        importlib.import_module(f"{__name__}.{mod}").register(app)
