"""The row-level objective of `sempar`: each fit token row is its own item.

With exact pre-routing (Sem-MoE Alg. 3, s-MoE's pre-routing; tp mode) a token row is homed
knowing its real top-k, on the device hosting most of them, every device taking an equal share
of each batch (the align step, `schedule.homes.oracle_home`). What decides the LAR then is not
which experts a token *id* activates on average (`AffinityStats.counts` c[l, u, e], the
`tokens` objective, right for homes predicted from a token table) but which experts one row
selects together. So the `rows` objective runs the same tp / dp alternation (solver.py) on a
copy of the fit trace in which row t carries token id t: the count table becomes each row's
one-hot expert set, the token step becomes the capacitated exact-pre-routing home of every fit
row (per pseudo-batch, as the align step), and the expert step maximises the co-activation of
the experts those rows select. A trace without token ids (`TraceMeta.has_token_ids` False) can
only be solved this way.

Objectives (`PlacementProblem.objective`):
- `tokens`: the token-id table (homes predicted from a token table);
- `rows`: the row-level items above (homes from exact pre-routing, and position homes with
  de-duplicated dispatch, where the experts one row selects together decide the copies);
- `auto` (the default): the objective of the deployment's home rule (`SolveOptions.homes`,
  `solve_options.HOME_RULES`: rows for positions and exact, tokens for table; tokens when no
  rule is named), `rows` when the trace has no token ids.

Choices (the issue leaves them open): above `max_rows` fit rows, whole fit requests are
sampled (seeded, `stats.sample`: the rule a merged `RoutingStats` sample follows too)
until the cap, so the solve stays bounded on large traces; the placement's
token table, when the fit trace has token ids, is rebuilt for the real ids with the
co-clustering rule (`base.token_table_row`: each token on the device holding most of its
expected activations; a replicated expert counts on its first copy's device), so predicted
homes still work; without ids the placement has no token table.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from sempar.stats.sample import sample_requests
from sempar.affinity.affinity_stats import AffinityStats
from sempar.placement.base import PlacementProblem, token_table_row
from sempar.placement.placement import Placement
from sempar.placement.sempar.held_out import HeldOut, calibrated_solve
from sempar.placement.sempar.row_replicas import replicate
from sempar.predict.token_table import TokenTable
from sempar.trace.schema import RoutingTrace, require_token_ids


def resolve_objective(p: PlacementProblem) -> str:
    """"tokens" or "rows" for `p` (`SolveOptions.items`: `auto` follows the home rule);
    "tokens" named on a trace without token ids is bad input."""
    objective = p.items(p.trace.meta.has_token_ids)
    if objective == "tokens":
        require_token_ids(p.trace.meta, "sempar --objective tokens", "; use --objective rows")
    return objective


def row_trace(trace: RoutingTrace, max_rows: int, seed: int) -> RoutingTrace:
    """The fit trace (sampled to `max_rows` rows by whole requests) with token id t on row t."""
    part = trace.take(sample_requests(trace.request_id, max_rows, seed))
    T = part.num_tokens
    meta = dataclasses.replace(part.meta, vocab_size=max(T, 1), has_token_ids=True)
    return dataclasses.replace(part, meta=meta, token_id=np.arange(T, dtype=np.int64))


def first_copy_device(placement: Placement) -> np.ndarray:
    """int64[L, N]: the device of each expert's first physical slot."""
    log2phy = placement.log2phy()[:, :, 0]
    return (log2phy // placement.slots_per_device).astype(np.int64)


def best_of(solver: Callable[..., Placement], p: PlacementProblem, restarts: int,
            **kw) -> Placement:
    """The best of `restarts` solves of `p` with seeds p.seed, p.seed + 1, ...: per layer in tp
    mode (layers are independent there; each layer's fit local activations,
    `info["fit_local_activations"]`, decide), the whole placement in dp mode (its layers share
    the requests' ranks). The alternation stops in a local optimum that its start decides; other
    METIS seeds start elsewhere. kw: `solver`'s keywords (held_out.py's `fit_cap`)."""
    runs = [solver(dataclasses.replace(p, seed=(p.seed + i) % 2**32), **kw)
            for i in range(max(1, restarts))]
    obj = [r.info["fit_local_activations"] for r in runs]
    if p.mode == "dp" or len(runs) == 1:
        return runs[int(np.argmax([float(np.sum(o)) for o in obj]))]
    best = np.asarray(obj, np.float64).argmax(axis=0)                       # run per layer
    out = runs[0]
    # runs[0]'s token table no longer matches; `solve_rows` drops it
    out.phy2log = np.stack([runs[b].phy2log[l] for l, b in enumerate(best)])
    out.info["fit_local_activations"] = [obj[b][l] for l, b in enumerate(best)]
    out.info["restarts"] = len(runs)
    return out


def solve_rows(p: PlacementProblem, solver: Callable[[PlacementProblem], Placement],
               max_rows: int, held_out: HeldOut, restarts: int = 1) -> Placement:
    """`solver` (the `sempar` entry point) on the row items of `p.trace` (module docstring)."""
    rows = row_trace(p.trace, max_rows, p.seed)
    primary = dataclasses.replace(p, trace=rows, objective="tokens", redundant=0)
    placement = calibrated_solve(primary, lambda q, **kw: best_of(solver, q, restarts, **kw), held_out,
                                 cv_solve=solver)    # folds: one start each (held_out.py)
    placement.token_table = None     # per fit row (or stale after `best_of`): no use online
    if p.redundant:
        cap = placement.info.get("held_out", {}).get("fit_cap", p.max_imbalance)
        placement = replicate(placement, rows.experts, p.redundant, cap)
    if p.trace.meta.has_token_ids:
        stats = AffinityStats(p.trace)
        dev = first_copy_device(placement)
        G = p.num_devices
        table = [token_table_row(stats, l, dev[l], G) for l in range(stats.L)]
        placement.token_table = TokenTable(stats.tokens, np.stack([t[0] for t in table]),
                                           np.stack([t[1] for t in table]))
    placement.info["fit_rows"] = rows.num_tokens
    placement.info["max_imbalance"] = p.max_imbalance   # the user's cap; the one solved at: held_out.fit_cap
    return placement
