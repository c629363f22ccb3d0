"""The per-batch linear programs of the `lp`, `lp-local` and `lp-cap` dispatch rules
(`placement.dispatch` registers them; issue 45, item 2).

After LPLB (deepseek-ai/LPLB: a per-batch LP over the edges between an expert's copies): per
batch, every replicated expert's activations n[e] are split over its copies, x[e, d] >= 0 with
sum_d x[e, d] = n[e]; y[e, d] <= min(x[e, d], h[e, d]) is the part served on its home device
(h[e, d]: the batch's activations of e homed on d). Device d's load is fixed[d] (single-copy
experts) + sum_e x[e, d]. Objectives (HiGHS, scipy):

- `lp` (LPLB's): minimise the peak z >= every load;
- `lp-local` (ours): the same, minus a small weight on the home-served parts (among the splits
  of least peak, the most activations stay home);
- `lp-cap` (ours): every load <= cap x the batch's mean load + z, z >= 0 the excess over the
  cap: minimise z first (no split within the cap is left unused), then maximise the home-served
  parts. Below the cap the split is free to keep activations home, so a placement balanced by
  its own copies pays for balance in locality only where the batch needs it.

The LP split is rounded per expert by largest remainder (`round_split`), and each copy's share
is filled with the activations homed on its device first (`fill_split`).

Shapes: ex int[n] the open activations' experts, hm int[n] their homes, copies int64[N, C]
(devices of each expert's copies, -1 padded), count int64[N], fixed float[G].
"""

from __future__ import annotations

import numpy as np


def lp_chooser(experts: np.ndarray, home: np.ndarray, copies: np.ndarray, count: np.ndarray,
               G: int, local_weight: float, cap: float | None = None):
    """choose(token indices int[n], open bool[n, k], fixed float[G]) -> int64[open]: the
    serving devices of one batch's open activations (row-major), for `_per_batch`.
    local_weight: `lp-local`'s weight (0: `lp`); cap: `lp-cap`'s bound x the batch mean
    (None: minimise the peak)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    N = count.size
    rep = np.nonzero(count > 1)[0]

    def choose(tok: np.ndarray, open_: np.ndarray, fixed: np.ndarray) -> np.ndarray:
        ex = experts[tok][open_]
        hm = np.broadcast_to(home[tok][:, None], open_.shape)[open_]
        n = np.bincount(ex, minlength=N)
        es = rep[n[rep] > 0]
        # variables: x[e, d] per copy (served share), y[e, d] (home-served part), then z
        pe = np.repeat(es, count[es])
        pd = np.concatenate([copies[e, :count[e]] for e in es])
        V = pe.size
        h = np.zeros((N, G))
        np.add.at(h, (ex, hm), 1.0)
        c = np.zeros(2 * V + 1)
        c[-1] = 1.0
        if cap is not None:            # lexicographic: all locality is worth < one unit of z
            c[V:2 * V] = -0.5 / max(float(ex.size), 1.0)
            level = np.full(G, cap * (float(fixed.sum()) + ex.size) / G)
        else:
            level = np.zeros(G)
            if local_weight:
                c[V:2 * V] = -local_weight * max(float(n.max()), 1.0) / max(float(ex.size), 1.0)
        # load rows: fixed[d] + sum_e x[e, d] - z <= level[d]; then y <= x
        A_ub = coo_matrix((np.r_[np.ones(V), -np.ones(G), np.ones(V), -np.ones(V)],
                           (np.r_[pd, np.arange(G), G + np.arange(V), G + np.arange(V)],
                            np.r_[np.arange(V), np.full(G, 2 * V), V + np.arange(V),
                                  np.arange(V)])), shape=(G + V, 2 * V + 1)).tocsr()
        A_eq = coo_matrix((np.ones(V), (np.searchsorted(es, pe), np.arange(V))),
                          shape=(es.size, 2 * V + 1)).tocsr()
        bounds = [(0, None)] * V + [(0, float(u)) for u in h[pe, pd]] + [(0, None)]
        res = linprog(c, A_ub=A_ub, b_ub=np.r_[level - fixed, np.zeros(V)], A_eq=A_eq,
                      b_eq=n[es].astype(float), bounds=bounds, method="highs")
        x = res.x[:V] if res.status == 0 else np.repeat(n[es] / count[es], count[es])
        fill = np.full(ex.size, -1, np.int64)
        for e in es:
            sl = slice(int(np.searchsorted(pe, e)), int(np.searchsorted(pe, e, "right")))
            fill[ex == e] = fill_split(hm[ex == e], pd[sl], round_split(x[sl], int(n[e])))
        return fill
    return choose


def round_split(x: np.ndarray, n: int) -> np.ndarray:
    """int64: x (non-negative, sum ~ n) rounded to integers summing to n (largest remainder)."""
    x = np.maximum(np.asarray(x, np.float64), 0)
    x = x * (n / x.sum()) if x.sum() > 0 else np.full(x.size, n / x.size)
    q = np.floor(x).astype(np.int64)
    q[np.argsort(-(x - q), kind="stable")[:n - int(q.sum())]] += 1
    return q


def fill_split(hm: np.ndarray, devs: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """int64[len(hm)]: serving devices of one expert's activations (homes hm) given the copies'
    devices and integer quotas summing to len(hm): each copy first takes activations homed on
    its own device, the rest fill the remaining quotas in device order."""
    out = np.full(hm.size, -1, np.int64)
    left = quota.copy()
    for j, d in enumerate(devs):
        mine = np.nonzero((hm == d) & (out < 0))[0][:left[j]]
        out[mine] = d
        left[j] -= mine.size
    out[out < 0] = np.repeat(devs, left)
    return out
