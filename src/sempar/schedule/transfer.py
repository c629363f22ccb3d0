"""Cross-dataset transfer: fit on one domain, evaluate on every other (Sem-MoE Tables 3-4).

Sem-MoE profiles on one dataset and serves another to show how much of the locality survives a
shift of workload. We do the same with the domains of one trace: for each fit domain d, the
placement is solved on a 20% split (by request) of d; it is evaluated on the other 80% of d (the
diagonal) and on the whole of every other domain (never seen in fit). Each cell is the held-out
LAR of the method in the given mode (homes as in `schedule.homes.method_home`).

    cross_dataset_matrix(trace, ep, options) -> {"domains": [...], "mode", "ep", "nodes",
        "methods": {name: {"lar": float[D][D] (row = fit domain, column = eval domain),
                           "diagonal_mean", "off_diagonal_mean", "retention"}}}

`retention` = off-diagonal mean / diagonal mean: the share of in-domain locality that transfers.
Every placement is solved with the user's `SolveOptions` whole (mode, load cap, replicas, ...),
as `evaluate`'s own table is, so the matrix labelled "dp" holds dp placements.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from sempar.errors import InputError
from sempar.placement.base import SOLVERS, check_token_ids, solve
from sempar.placement.metrics import placement_figures
from sempar.schedule.homes import method_home
from sempar.solve_options import SolveOptions
from sempar.trace.ops import select_domains, split_by_request
from sempar.trace.schema import RoutingTrace

DEFAULT_METHODS = ("vanilla", "eplb", "metis", "smoe-cem", "semmoe", "sempar")


def cross_dataset_matrix(trace: RoutingTrace, ep: int, options: SolveOptions | None = None, *,
                         methods: tuple[str, ...] | list[str] = DEFAULT_METHODS,
                         min_requests: int = 10, skip_refused: bool = False,
                         progress: Callable[[str], None] | None = None,
                         home: Callable[..., np.ndarray] | None = None) -> dict:
    """The fit-domain x eval-domain LAR matrix of each method (module docstring), its placements
    solved with `options` (None: the defaults; its `mode` also picks the homes, its `seed` the
    splits). `skip_refused`: a method that cannot serve `options` on this trace (no replicas,
    no token ids: `SolverSpec.refusal`, `base.check_token_ids`) is listed under "skipped" with
    its reason (evaluate's `all`); without it the refusal stops the matrix.

    `home(placement, fit, eval, mode) -> int32[T, L]` places the eval tokens; default: the
    method's own (`schedule.homes.method_home`); `evaluate --online` passes its online schedulers.
    """
    options = options or SolveOptions()
    mode, seed, nodes = options.mode, options.seed, options.num_nodes
    if home is None:
        home = lambda placement, fit, ev, mode: method_home(placement, ev, mode)  # noqa: E731
    counts = trace.domain_counts() if trace.domains else {}
    domains = [d for d, n in counts.items() if n > 0]
    if len(domains) < 2:
        raise InputError("cross-dataset: the trace needs at least two domains "
                         f"(it has {len(domains)})")
    parts = {d: select_domains(trace, [d]) for d in domains}
    for d, t in parts.items():
        if t.num_requests < min_requests:
            raise InputError(f"cross-dataset: domain {d!r} has {t.num_requests} requests "
                             f"(need {min_requests} to split 20/80)")
    splits = {d: split_by_request(t, seed=seed) for d, t in parts.items()}
    out = {"domains": domains, "mode": mode, "ep": ep, "nodes": nodes,
           "redundant": options.redundant, "methods": {}}
    for name in methods:
        why = refusal(name, trace, options)
        if why and not skip_refused:
            raise InputError(why)
        if why:
            out.setdefault("skipped", {})[name] = why
            continue
        lar = np.zeros((len(domains), len(domains)))
        for i, d in enumerate(domains):
            if progress:
                progress(f"{name}: fit on {d}")
            placement = solve(name, splits[d][0], num_devices=ep, options=options)
            for j, e in enumerate(domains):
                ev = splits[d][1] if e == d else parts[e]
                h = home(placement, splits[d][0], ev, mode)
                lar[i, j] = placement_figures(placement, ev.experts, h)["lar_mean"]
        diag = float(np.mean(np.diag(lar)))
        off = float(lar[~np.eye(len(domains), dtype=bool)].mean())
        out["methods"][name] = {"lar": np.round(lar, 4).tolist(), "diagonal_mean": diag,
                                "off_diagonal_mean": off, "retention": off / diag if diag else 0.0}
    return out


def refusal(name: str, trace: RoutingTrace, options: SolveOptions) -> str | None:
    """Why method `name` cannot be solved with `options` on `trace`, in one line, else None."""
    why = SOLVERS.get(name).refusal(name, trace, redundant=options.redundant, mode=options.mode,
                                    preserve_groups=options.preserve_groups)
    if why is None:
        try:
            check_token_ids(name, options.mode, trace, hint=False)
        except InputError as err:
            why = str(err)
    return why
