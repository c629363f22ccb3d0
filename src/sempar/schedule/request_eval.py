"""Request policies evaluated on a routing trace: arrival orders, per-rank balance, and LAR.

The policies themselves live in `sempar.schedule.requests` (registered in `REQUEST_POLICIES`);
this module replays a trace's requests through them in a chosen arrival order and reports what
each assignment does to locality (Attention-DP homes, docs/design.md "Home device") and balance.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from sempar.errors import InputError
from sempar.schedule.requests import REQUEST_POLICIES, make_policy, request_arrays

ORDERS = ("interleaved", "by-domain")


def reorder_requests(trace, order: str, seed: int = 0):
    """The trace with its requests in arrival order `order` (token rows follow their request):
    `by-domain` = sorted by domain, stable (same-domain bursts); `interleaved` = a seeded shuffle;
    `as-is` = unchanged."""
    if order == "as-is":
        return trace
    _, first, inv = np.unique(trace.request_id, return_index=True, return_inverse=True)
    if order == "by-domain":
        dom = (np.zeros(first.size, np.int64) if trace.domain is None
               else trace.domain[first].astype(np.int64))
        pos = np.lexsort((first, dom))               # by domain, then original arrival
    elif order == "interleaved":
        pos = np.random.default_rng(seed).permutation(first.size)
    else:
        raise InputError(f"order: {order!r}; choose one of: {', '.join(ORDERS)}, as-is")
    arrival = np.empty(first.size, np.int64)
    arrival[pos] = np.arange(first.size)
    return trace.take(np.argsort(arrival[inv.reshape(-1)], kind="stable"))


def rank_figures(ranks: np.ndarray, lens: np.ndarray, num_ranks: int, window: int) -> dict:
    """Balance of an assignment: per-rank tokens max/mean over the stream, the mean over windows
    of `window` requests of the same, and the largest per-round spread (max - min) of requests
    per rank over rounds of G consecutive requests (complete rounds)."""
    G = num_ranks
    tok = np.bincount(ranks, weights=lens, minlength=G)
    nwin = max(1, ranks.size // window)
    w = np.zeros((nwin, G))
    wi = np.minimum(np.arange(ranks.size) // window, nwin - 1)
    np.add.at(w, (wi, ranks), lens)
    full = ranks.size // G * G
    cnt = np.zeros((full // G, G), np.int64)
    np.add.at(cnt, (np.arange(full) // G, ranks[:full]), 1)
    return {"tokens_max_mean": float(tok.max() / max(tok.mean(), 1e-12)),
            "window_tokens_max_mean": float((w.max(1) / np.maximum(w.mean(1), 1e-12)).mean()),
            "round_count_spread": int((cnt.max(1) - cnt.min(1)).max()) if full else 0}


def evaluate_policies(placement, eval_trace, orders: Sequence[str] = ORDERS,
                      policies: Sequence[str] | dict[str, tuple[str, dict]] | None = None,
                      seed: int = 0) -> dict:
    """{order: {label: figures}} for each policy on `placement` under each arrival order.

    placement: a `Placement` (its token table guides the policies); eval_trace: RoutingTrace.
    policies: names, or {label: (name, constructor kwargs)} for variants; default every
    registered policy; round-robin is always added (the ratios' base). Figures: `lar_mean`,
    `imbalance_max_mean` (metrics.placement_figures, Attention-DP homes), `lar_ratio` (to
    round-robin's LAR in the same order), `tokens_max_mean`, `window_tokens_max_mean` (windows of
    8 G requests), `round_count_spread` (see `rank_figures`), `seconds` (the batch `assign`).
    """
    from sempar.placement.metrics import placement_figures   # schedule sits right of placement

    G, L = placement.num_devices, eval_trace.meta.num_layers
    if policies is None:
        policies = REQUEST_POLICIES.names()
    specs = (dict(policies) if isinstance(policies, dict)
             else {name: (name, {}) for name in policies})
    specs = {"round-robin": ("round-robin", {}), **specs}
    out: dict[str, dict] = {}
    for order in orders:
        tr = reorder_requests(eval_trace, order, seed)
        tok, off, rows = request_arrays(tr.request_id, tr.token_id)
        experts = tr.experts[rows]
        lens = np.diff(off)
        res = {}
        for label, (name, kw) in specs.items():
            pol = make_policy(name, G, placement.token_table, **kw)
            t0 = time.perf_counter()
            ranks = pol.assign(tok, off)
            secs = time.perf_counter() - t0
            home = np.repeat(np.repeat(ranks, lens)[:, None], L, axis=1)
            fig = placement_figures(placement, experts, home)
            res[label] = {"lar_mean": fig["lar_mean"], "imbalance_max_mean": fig["imbalance_max_mean"],
                          **rank_figures(ranks, lens, G, 8 * G), "seconds": secs}
        base = res["round-robin"]["lar_mean"]
        for r in res.values():
            r["lar_ratio"] = r["lar_mean"] / base if base else float("nan")
        out[order] = res
    return out
