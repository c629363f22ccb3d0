"""Cross-dataset transfer: fit on one domain, evaluate on every other (Sem-MoE Tables 3-4).

Sem-MoE profiles on one dataset and serves another to show how much of the locality survives a
shift of workload. We do the same with the domains of one trace: for each fit domain d, the
placement is solved on a 20% split (by request) of d; it is evaluated on the other 80% of d (the
diagonal) and on the whole of every other domain (never seen in fit). Each cell is the held-out
LAR of the method in the given mode (homes as in `schedule.homes.method_home`).

    cross_dataset_matrix(trace, ep, ...) -> {"domains": [...], "mode", "ep", "nodes",
        "methods": {name: {"lar": float[D][D] (row = fit domain, column = eval domain),
                           "diagonal_mean", "off_diagonal_mean", "retention"}}}

`retention` = off-diagonal mean / diagonal mean: the share of in-domain locality that transfers.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from sempar.errors import InputError
from sempar.placement.base import solve
from sempar.placement.metrics import placement_figures
from sempar.schedule.homes import method_home
from sempar.trace.ops import select_domains, split_by_request
from sempar.trace.schema import RoutingTrace

DEFAULT_METHODS = ("vanilla", "eplb", "metis", "smoe-cem", "semmoe", "sempar")


def cross_dataset_matrix(trace: RoutingTrace, ep: int, nodes: int = 1,
                         methods: tuple[str, ...] | list[str] = DEFAULT_METHODS, mode: str = "tp",
                         seed: int = 0, min_requests: int = 10,
                         progress: Callable[[str], None] | None = None,
                         home: Callable[..., np.ndarray] | None = None) -> dict:
    """The fit-domain x eval-domain LAR matrix of each method (module docstring).

    `home(placement, fit, eval, mode) -> int32[T, L]` places the eval tokens; default: the
    method's own (`schedule.homes.method_home`); `evaluate --online` passes its online schedulers.
    """
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
    out = {"domains": domains, "mode": mode, "ep": ep, "nodes": nodes, "methods": {}}
    for name in methods:
        lar = np.zeros((len(domains), len(domains)))
        for i, d in enumerate(domains):
            if progress:
                progress(f"{name}: fit on {d}")
            placement = solve(name, splits[d][0], num_devices=ep, num_nodes=nodes, seed=seed)
            for j, e in enumerate(domains):
                ev = splits[d][1] if e == d else parts[e]
                h = home(placement, splits[d][0], ev, mode)
                lar[i, j] = placement_figures(placement, ev.experts, h)["lar_mean"]
        diag = float(np.mean(np.diag(lar)))
        off = float(lar[~np.eye(len(domains), dtype=bool)].mean())
        out["methods"][name] = {"lar": np.round(lar, 4).tolist(), "diagonal_mean": diag,
                                "off_diagonal_mean": off, "retention": off / diag if diag else 0.0}
    return out
