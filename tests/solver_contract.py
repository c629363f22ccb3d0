"""The contract every registered placement solver keeps, as one check that lists what breaks it.

`contract_violations` solves through `base.solve` (so the registry's declared capabilities are
what is judged) on a small trace and on a grouped one, and returns one line per violation:
- a valid placement of every expert once at EP G (`solve` validates it);
- the same seed twice gives the same phy2log;
- replicas declared: `redundant = G` gives N + G slots per layer; undeclared: refused;
- preserves_groups declared: no expert leaves its group's slots; undeclared: refused;
- each declared mode solves, each undeclared one is refused; a solver not declared mode-aware
  gives the same placement in tp and dp (`evaluate` solves it once for both);
- every refusal is an `InputError` of one line.
"""

from __future__ import annotations

import numpy as np

from sempar.errors import InputError
from sempar.placement.base import SolverRegistry, crosses_groups, solve
from sempar.placement.placement import Placement
from sempar.trace import RoutingTrace

MODES = ("tp", "dp")


def contract_violations(name: str, registry: SolverRegistry, trace: RoutingTrace,
                        grouped: RoutingTrace, G: int = 4) -> list[str]:
    """One line per broken promise of solver `name` in `registry`; [] when it keeps them all.
    trace: any fit trace with N divisible by G; grouped: one with num_expert_groups > 1."""
    spec = registry.get(name)
    out: list[str] = []

    def attempt(what: str, t: RoutingTrace = trace, **kw) -> Placement | None:
        try:
            return solve(name, t, num_devices=G, registry=registry, **kw)
        except InputError as err:
            out.append(f"{what}: declared, but solve failed: {err}")
            return None

    def refused(what: str, t: RoutingTrace = trace, **kw) -> None:
        try:
            solve(name, t, num_devices=G, registry=registry, **kw)
        except InputError as err:
            if not str(err) or "\n" in str(err):
                out.append(f"{what}: refused, but not in one line: {str(err)!r}")
            return
        out.append(f"{what}: not declared, but not refused")

    N, L = trace.meta.num_experts, trace.meta.num_layers
    first = attempt("plain solve", seed=0)
    if first is None:
        return out
    if first.phy2log.shape != (L, N) or first.num_devices != G:
        out.append(f"plain solve: phy2log {first.phy2log.shape}, {first.num_devices} devices "
                   f"(want {(L, N)}, {G})")
    again = attempt("same seed", seed=0)
    if again is not None and not np.array_equal(first.phy2log, again.phy2log):
        out.append("same seed: two solves gave different phy2log")
    if spec.replicas:
        rep = attempt("replicas", redundant=G)
        if rep is not None and rep.phy2log.shape != (L, N + G):
            out.append(f"replicas: redundant={G} gave phy2log {rep.phy2log.shape}, "
                       f"want {(L, N + G)}")
    else:
        refused("replicas", redundant=G)
    ng = grouped.meta.num_expert_groups
    if spec.preserves_groups:
        kept = attempt("preserve_groups", grouped, preserve_groups=True)
        where = None if kept is None else crosses_groups(kept, ng)
        if where:
            out.append(f"preserve_groups: crosses groups ({where})")
    else:
        refused("preserve_groups", grouped, preserve_groups=True)
    by_mode = {}
    for mode in MODES:
        if mode in spec.modes:
            by_mode[mode] = attempt(f"mode {mode}", mode=mode)
        else:
            refused(f"mode {mode}", mode=mode)
    tp, dp = by_mode.get("tp"), by_mode.get("dp")
    if not spec.mode_aware and tp is not None and dp is not None \
            and not np.array_equal(tp.phy2log, dp.phy2log):
        out.append("mode_aware: not declared, but tp and dp placements differ")
    return out
