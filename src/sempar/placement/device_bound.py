"""The device-configuration bound: an upper bound on the capacity-bound exact-home LAR of ANY
placement at one layer (`bound.lar_upper_bound` keeps it where it is lower than the pair budget).

The figure bounded (docs/design.md "Oracle LAR", tp mode): per batch of `BATCH` rows, each device
homes its equal share (at most ceil(n / G) of the batch's n rows), a row homed on device d
counts |S_t ∩ D_d| local activations; maximised over every partition of the N experts into G
device sets of S = N / G and every such home assignment (`capacity.capacity_home`'s proposal
rounds are one assignment, so their figure is below it).

The bound (ours; a Dantzig-Wolfe / configuration relaxation, in the spirit of the set-partitioning
formulations of capacitated clustering):

1. drop the coupling "each row homed on one device" and keep each device's capacity: device d
   alone can count at most V(D_d) = sum over batches b of the sum of the ceil(n_b / G) largest
   |S_t ∩ D_d| over the rows t of b, so any placement's figure is <= sum_d V(D_d);
2. max over partitions of sum_d V(D_d) <= the LP max sum_D w_D V(D) over every S-subset D of
   the experts, w >= 0, sum_{D ∋ e} w_D = 1 for each expert e (a partition is the 0/1 point),
   solved by HiGHS. Its value is the Lagrangian bound min_mu sum_e mu_e + G max_D [V(D) - mu(D)].

V(D) for every D at once: with c_i(D) = sum over i-subsets J of D of the batch's rows
containing J (counted once per batch for every i <= min(k, S)), the rows with exactly m experts
in D solve c_i = sum_m C(m, i) n_m (upper triangular), and the batch's ceil(n / G) largest
take the n_m from m = min(k, S) down. This enumerates C(N, S) subsets, so it runs where that is
at most `BoundConfig.max_device_sets` (GPT-OSS-20B at EP 8: C(32, 4) = 35,960; DeepSeek-V2-Lite's
C(64, 8) is 4.4e9, beyond it: the pair budget alone there). How tight it is: docs/placement.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from math import comb

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix

from sempar.placement.capacity import BATCH
from sempar.placement.colgen_bound import ColgenConfig
from sempar.placement.row_pair_bound import RowPairConfig


@dataclass(frozen=True)
class BoundConfig:
    """Knobs of `evaluate`'s bound row.

    max_device_sets: the device-configuration bound runs at a layer when C(N, N / G) is at most
        this (its V table is float64[C(N, S)] and the work ~ C(N, S) x sum_i C(S, i) per batch);
    time_limit_s: HiGHS's limit for one layer's LP; a layer whose LP does not reach optimality
        keeps the pair budget (an unfinished LP's value bounds nothing);
    batch: the tp batch whose equal shares cap each device (docs/design.md's 2,048);
    colgen_max_sets: where C(N, S) is above max_device_sets but at most this, the column-generation
        bound (`colgen_bound`) runs instead (its exact pricing scan enumerates, pruned, up to
        C(N, S) sets: GPT-OSS-20B at EP 4, C(32, 8) = 10.5M; not DeepSeek-V2-Lite's C(64, 8));
    colgen: its knobs;
    row_pair: the row-pair Lagrangian bound's knobs (`row_pair_bound`), run at the layers where
        neither LP runs (DeepSeek-V2-Lite); None: not run (the pair budget alone there);
    colgen_large: where C(N, S) is above colgen_max_sets (DeepSeek-V2-Lite), the column
        generation's knobs there (one cap a layer, `parts=1`, and anytime scans from a high
        floor down, `slack_start`; its CPU budget a layer is `budget_s`), beside the row-pair
        bound, the least kept; None: not run (a scan expands ~150k nodes a CPU second here, so
        `max_nodes` caps one scan at ~35 CPU s);
    colgen_large_total_s: CPU seconds of this process for colgen_large over all layers, taken
        layer by layer in order; the layers after it is spent keep the other bounds;
    colgen_large_misses: colgen_large stops for the later layers once this many layers in a row
        gained nothing from it (DeepSeek-V2-Lite EP 4: C(64, 16) sets, no scan finishes).
    """

    max_device_sets: int = 100_000
    time_limit_s: float = 60.0
    batch: int = BATCH
    colgen_max_sets: int = 20_000_000
    colgen: ColgenConfig = ColgenConfig()
    row_pair: RowPairConfig | None = RowPairConfig()
    colgen_large: ColgenConfig | None = ColgenConfig(
        budget_s=15.0, parts=1, slack_start=0.3, slack=0.02, max_nodes=5_000_000)
    colgen_large_total_s: float = 600.0
    colgen_large_misses: int = 3


# `evaluate --bound`: how much the bound row may cost. "fast" (evaluate's default) keeps the
# listed LP and the pair budget and skips the column generation (GPT-OSS-20B at EP 4: 61 of
# evaluate's 76 s wall went to it) and the row-pair Lagrangian bound; "full" is `BoundConfig()` (what bench_rows_speed.py
# reports); "none" leaves the bound rows out. Every effort's bound is valid: each layer keeps
# the least of the bounds it ran.
BOUND_EFFORTS: dict[str, BoundConfig | None] = {
    "fast": BoundConfig(colgen_max_sets=0, row_pair=None, colgen_large=None),
    "full": BoundConfig(), "none": None}


def _colex_rank(sets: np.ndarray) -> np.ndarray:
    """int64[...]: the colex rank of each sorted i-subset in sets int[..., i]
    (sum over j of C(c_j, j + 1))."""
    out = np.zeros(sets.shape[:-1], np.int64)
    for j in range(sets.shape[-1]):
        c = sets[..., j]
        out += np.array([comb(int(v), j + 1) for v in range(int(c.max()) + 2)], np.int64)[c] \
            if c.size else 0
    return out


def _subsets(sets: np.ndarray, i: int) -> np.ndarray:
    """int64[n, C(w, i)]: colex ranks of the i-subsets of each sorted row of sets int[n, w]."""
    from itertools import combinations

    pick = np.array(list(combinations(range(sets.shape[1]), i)), np.int64)   # [C(w, i), i]
    return _colex_rank(sets[:, pick])


def device_sets(N: int, S: int) -> np.ndarray:
    """int64[C(N, S), S]: every S-subset of range(N), sorted rows."""
    from itertools import combinations

    return np.fromiter((e for c in combinations(range(N), S) for e in c), np.int64,
                       comb(N, S) * S).reshape(-1, S)


def device_values(experts: np.ndarray, N: int, G: int, batch: int = BATCH,
                  sets: np.ndarray | None = None) -> np.ndarray:
    """float64[C(N, S)]: V(D) for every S-subset D (order of `device_sets`): the most local
    activations device set D can count, its share of each batch homed on it (module step 1).

    experts: int[T, k] one layer's routed experts (distinct within a row)."""
    ex = np.sort(np.asarray(experts, np.int64), axis=1)
    T, k = ex.shape
    S = N // G
    D = device_sets(N, S) if sets is None else sets
    M = min(k, S)
    inside = [_subsets(D, i) for i in range(1, M + 1)]            # [nD, C(S, i)] each
    row_sub = [_subsets(ex, i) for i in range(1, M + 1)]          # [T, C(k, i)] each
    # n_m from c_i: invert the upper-triangular C(m, i) (integers: exact after rounding)
    inv = np.linalg.inv(np.array([[comb(m, i) for m in range(1, M + 1)]
                                  for i in range(1, M + 1)], np.float64))
    V = np.zeros(D.shape[0])
    for lo in range(0, T, batch):
        n = min(batch, T - lo)
        cap = float(-(-n // G))
        c = np.stack([np.bincount(rs[lo:lo + n].ravel(), minlength=comb(N, i + 1))
                      .astype(np.float64)[ins].sum(axis=1)
                      for i, (rs, ins) in enumerate(zip(row_sub, inside))])   # [M, nD]
        nm = np.rint(inv @ c)
        left = np.full(D.shape[0], cap)
        for m in range(M, 0, -1):
            take = np.minimum(left, nm[m - 1])
            V += m * take
            left -= take
    return V


def config_bound(experts: np.ndarray, N: int, G: int, config: BoundConfig = BoundConfig(),
                 max_imbalance: float | None = None) -> dict | None:
    """{"local": the bound on local activations at this layer (module step 2), "local_any": the
    same over every placement (= "local" without max_imbalance), "witness": int64[N] a
    placement's experts in device order (slot // S = device) rounded from the LP, "seconds"},
    or None where C(N, N / G) exceeds config.max_device_sets or HiGHS did not finish.

    max_imbalance: None (any placement), or only placements whose device loads at this layer
    (activations served, sum of the experts' counts) are at most max_imbalance x the mean T k / G:
    the device sets above that load are dropped from the LP, so every such placement is still
    one of its points (no such set or partition: "local" is "local_any", still valid).

    The bound is the Lagrangian form sum_e mu_e + G max_D [V(D) - mu(D)] at the LP's duals mu,
    evaluated here over every D: valid for ANY mu (relax "each expert on one device" with price
    mu_e, then every device picks its best set alone), so it does not rest on HiGHS's tolerances;
    at the LP's optimum it equals the LP's value."""
    S = N // G
    if N % G or comb(N, S) > config.max_device_sets:
        return None
    t0 = time.perf_counter()
    D = device_sets(N, S)
    V = device_values(experts, N, G, config.batch, D)
    top = float(np.asarray(experts).size)
    full = _lp_bound(D, V, N, G, config)
    if full is None:
        return None
    out = {"local": min(full[0], top), "local_any": min(full[0], top), "witness": full[1]}
    if max_imbalance is not None:
        count = np.bincount(np.asarray(experts, np.int64).ravel(), minlength=N)
        keep = count[D].sum(axis=1) <= max_imbalance * count.sum() / G * (1 + 1e-12)
        part = _lp_bound(D[keep], V[keep], N, G, config) if keep.any() else None
        if part is not None:
            out["local"], out["witness"] = min(part[0], out["local"]), part[1]
    out["seconds"] = time.perf_counter() - t0
    return out


def _lp_bound(D: np.ndarray, V: np.ndarray, N: int, G: int, config: BoundConfig
              ) -> tuple[float, np.ndarray] | None:
    """(the Lagrangian bound at the LP's duals over the device sets D int[n, S] with values
    V float64[n], the LP's rounded partition), or None where HiGHS did not finish (or found
    no partition in D)."""
    S = D.shape[1]
    A = csr_matrix((np.ones(D.size), (D.ravel(), np.repeat(np.arange(D.shape[0]), S))),
                   shape=(N, D.shape[0]))
    res = linprog(-V, A_eq=A, b_eq=np.ones(N), bounds=(0, None), method="highs",
                  options={"time_limit": config.time_limit_s})
    if res.status != 0:
        return None
    mu = -np.asarray(res.eqlin.marginals, np.float64)          # prices of "e on one device"
    local = float(mu.sum() + G * (V - mu[D].sum(axis=1)).max())
    return local * (1 + 1e-12), _round(D, res.x, N, G)


def _round(D: np.ndarray, w: np.ndarray, N: int, G: int) -> np.ndarray:
    """int64[N]: the LP's device sets by decreasing weight, each taken while disjoint from
    those taken; the experts left fill the remaining devices in id order."""
    used = np.zeros(N, bool)
    groups = []
    for j in np.argsort(-w, kind="stable")[: 4 * N]:
        if w[j] <= 1e-9 or len(groups) == G:
            break
        if not used[D[j]].any():
            groups.append(D[j])
            used[D[j]] = True
    return np.concatenate([*groups, np.flatnonzero(~used)]).astype(np.int64)
