"""An upper bound on the exact-home LAR of ANY placement (`evaluate`'s "bound" ref row).

The figure bounded: tp mode's capacity-bound exact-home LAR on a trace (docs/design.md "Oracle LAR":
each row homed knowing its real top-k, equal shares per batch), maximised over every placement
of N experts on G devices, N / G each. Dropping the homes' capacity can only raise it, so the
bound is on the unconstrained figure: per layer, max over partitions P of
sum_t m_t / (T k) with m_t = max_d |S_t ∩ P_d| (row t's experts S_t on its best device).

The bound (ours; a pair budget, not a MILP: the MILP's LP relaxation is 1.0 whatever the data,
x[e, d] = z[t, d] = 1/G being feasible, so HiGHS's dual bound stays there for any time limit we
can afford; docs/placement.md):

1. row t's m_t experts on its home device are C(m_t, 2) pairs of its experts on one device, so
   sum_t C(m_t, 2) <= Pi(P), the co-activation weight of the expert pairs P puts on one device
   (A[e, f]: rows selecting both e and f);
2. Pi(P) <= Pi*, bounded two ways, the lower kept: the star bound (each expert's S - 1 heaviest
   partners, half the sum: a device holds S experts) and the eigenvalue bound of balanced
   graph partitioning (Donath and Hoffman 1973: sum_d 1_Pd^T (A + diag u) 1_Pd <=
   S x the sum of the G largest eigenvalues of A + diag u for any u, whose entries cost sum u;
   u improved by subgradient steps);
3. max sum_t m_t with sum_t C(m_t, 2) <= Pi*, 1 <= m_t <= min(k, S): C(m, 2) is convex, so the
   budget buys the cheapest increments first (every row from 1 to 2 local at 1 pair each, then
   2 to 3 at 2 pairs each, ...).

Valid for every placement and trace; how tight it is on real routing: docs/placement.md. Rows with
the same expert set are one weighted item (the counts only see the set).

The pair budget drops the homes' capacity; `device_bound.config_bound` (the device-configuration
LP) keeps it and is far tighter where its C(N, N / G) device sets can be enumerated, and
`colgen_bound` (the same LP, one cap a tp batch by default, by column generation, its pricing
an exact pruned scan) where they are too many to list but few enough to scan; where neither
LP runs, `row_pair_bound` (this budget with a price a row and the co-located pairs bounded by the
semidefinite relaxation with nonnegativity) and, with `BoundConfig.colgen_large`, the column
generation again with one cap a layer and anytime scans (Farley's bound at a floor lowered while
its CPU budget lasts): each layer keeps the lowest (all are valid).
"""

from __future__ import annotations

import time
from math import comb

import numpy as np
from threadpoolctl import threadpool_limits

from sempar.placement.colgen_bound import colgen_bound
from sempar.placement.row_pair_bound import row_pair_bound
from sempar.placement.set_scan import coactivation
from sempar.placement.device_bound import BoundConfig, config_bound
from sempar.trace.schema import RoutingTrace


def star_bound(A: np.ndarray, S: int) -> float:
    """Pairs' weight on one device of any partition into groups of S: each expert with its
    S - 1 heaviest partners, halved (every pair counted from both ends)."""
    if S <= 1:
        return 0.0
    top = -np.sort(-A, axis=1)[:, :S - 1]
    return float(top.sum() / 2)


def eigen_bound(A: np.ndarray, G: int, steps: int = 60) -> float:
    """Donath-Hoffman: the intra-group weight of any partition of A's N nodes into G groups of
    S = N / G is at most min over u of (S x sum of the G largest eigenvalues of A + diag u
    - sum u) / 2; u by `steps` subgradient steps (any u gives a valid bound; the least kept)."""
    N = A.shape[0]
    S = N // G
    u = np.zeros(N)
    best = np.inf
    scale = max(float(np.abs(A).sum(axis=1).max()), 1.0)
    for it in range(steps):
        w, V = np.linalg.eigh(A + np.diag(u))
        top = V[:, -G:]
        val = (S * float(w[-G:].sum()) - float(u.sum())) / 2
        best = min(best, val)
        g = S * (top ** 2).sum(axis=1) - 1.0               # d val / d u (x2)
        if not np.any(np.abs(g) > 1e-9):
            break
        u -= scale * 0.5 / (it + 1) * g / max(float(np.linalg.norm(g)), 1e-12)
    return float(best)


def budget_rows(rows: float, budget: float, top: int) -> float:
    """max sum_t m_t over `rows` rows with sum_t C(m_t, 2) <= budget, 1 <= m_t <= top (step 3:
    level j -> j + 1 costs j pairs a row, cheapest first; a level is bought in part)."""
    total, left = float(rows), float(budget)
    for j in range(1, top):
        full = j * rows
        if left >= full:
            total += rows
            left -= full
        else:
            total += left / j
            break
    return total


def budget_price(rows: float, budget: float, top: int) -> float:
    """The pair budget's price of a pair (its LP dual): 1 / j for the level j -> j + 1 it stops
    in (step 3), 0 where every row reaches `top`."""
    left = float(budget)
    for j in range(1, top):
        if left < j * rows:
            return 1.0 / j
        left -= j * rows
    return 0.0


def layer_bound(experts: np.ndarray, N: int, G: int) -> dict:
    """The bound's parts at one layer; experts int[T, k]: {"local": the bound on local
    activations, "pairs": Pi*, "star", "eigen", "price": the budget's price of a pair}."""
    T, k = experts.shape
    S = N // G
    A = coactivation(experts, N)
    star, eig = star_bound(A, S), eigen_bound(A, G)
    pairs = min(star, eig)
    return {"local": min(budget_rows(T, pairs, min(k, S)), float(T * k)), "pairs": pairs,
            "star": star, "eigen": eig, "price": budget_price(T, pairs, min(k, S))}


def lar_upper_bound(trace: RoutingTrace, G: int, config: BoundConfig = BoundConfig(),
                    max_imbalance: float | None = None, start: np.ndarray | None = None
                    ) -> dict:
    """{"lar_mean": the bound on the capacity-bound exact-home LAR (mean over layers) of any
    placement of `trace`'s experts on G devices, "per_layer": [float], "per_layer_method":
    [CONFIG_METHOD | COLGEN_METHOD | ROWPAIR_METHOD | PAIR_METHOD] (the lowest at each layer), "max_imbalance": the
    balance the bound assumes of every placement (None: any; the pair budget assumes none, so it
    is valid for both), "lar_mean_any_balance": the bound over every placement, "witness": per layer
    int64[N] (the LP's rounded placement, experts in device order) or None, "method": its name,
    "seconds": per layer the seconds its bounds took}.

    start: int64[L, N] a placement's experts in device order per layer (slot // S = device; e.g.
    the solver's `phy2log`), meeting max_imbalance: it seeds the column generation's LP (only
    its speed depends on it, not the bound's validity)."""
    L, N, k = trace.meta.num_layers, trace.meta.num_experts, trace.meta.top_k
    T = trace.num_tokens
    per, how, witness, per_any, secs = [], [], [], [], []
    S = N // G
    cg_ok = N % G == 0 and config.max_device_sets < comb(N, S) <= config.colgen_max_sets
    # beyond colgen_max_sets (DeepSeek-V2-Lite): the same column generation, its scans anytime
    # (`ColgenConfig.slack_start`), beside the row-pair bound
    cg_large = N % G == 0 and comb(N, S) > max(config.colgen_max_sets, config.max_device_sets) \
        and config.colgen_large is not None
    large_cpu, misses = 0.0, 0      # colgen_large's CPU seconds, layers in a row it lost
    with threadpool_limits(1):      # 64 x 64 eigensolves, small LPs: threads only contend
        for l in range(L):
            t0 = time.perf_counter()
            ex = np.asarray(trace.experts[:, l], np.int64)
            parts = layer_bound(ex, N, G)
            pair, pair_how = parts["local"], PAIR_METHOD
            cfg = config_bound(ex, N, G, config, max_imbalance)
            if cfg is None and not cg_ok and config.row_pair is not None:
                rp = row_pair_bound(ex, N, G, config.row_pair, parts["price"] or None)
                if rp["local"] < pair:
                    pair, pair_how = rp["local"], ROWPAIR_METHOD
            any_ = pair if cfg is None else min(pair, cfg["local_any"])
            method = CONFIG_METHOD
            if cfg is None and (cg_ok or (cg_large and misses < config.colgen_large_misses
                                          and large_cpu < config.colgen_large_total_s)):
                c0 = time.process_time()
                cfg = colgen_bound(ex, N, G, config.colgen if cg_ok else config.colgen_large,
                                   max_imbalance, None if start is None else start[l],
                                   config.batch, target=None if cg_ok else pair)
                if not cg_ok:
                    large_cpu += time.process_time() - c0
                    misses = 0 if cfg is not None and cfg["local"] < pair else misses + 1
                method = COLGEN_METHOD
                if cfg is not None and max_imbalance is None:
                    any_ = min(pair, cfg["local"])
            use_cfg = cfg is not None and cfg["local"] < pair
            per.append((cfg["local"] if use_cfg else pair) / max(T * k, 1))
            how.append(method if use_cfg else pair_how)
            witness.append(None if cfg is None else cfg["witness"])
            per_any.append(any_ / max(T * k, 1))
            secs.append(time.perf_counter() - t0)
    names = [m for m in (CONFIG_METHOD, COLGEN_METHOD, ROWPAIR_METHOD, PAIR_METHOD) if m in how]
    return {"lar_mean": float(np.mean(per)) if per else 0.0, "per_layer": per,
            "lar_mean_any_balance": float(np.mean(per_any)) if per_any else 0.0,
            "per_layer_method": how, "witness": witness, "max_imbalance": max_imbalance,
            "method": " + ".join(names) or PAIR_METHOD, "seconds": secs}


CONFIG_METHOD = "device configuration LP (capacity-bound, HiGHS)"
COLGEN_METHOD = ("device configuration LP by column generation (exact pricing scan, "
                 "Lagrangian bound)")
ROWPAIR_METHOD = ("row-pair Lagrangian (a price a row, semidefinite bound with nonnegativity on "
                  "co-located pairs)")
PAIR_METHOD = "pair budget (star / Donath-Hoffman eigenvalue bound on co-located pairs)"
