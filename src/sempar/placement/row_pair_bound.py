"""The row-pair Lagrangian bound: the pair budget (`bound.py`) with one price a row and the
co-located pairs bounded by a semidefinite relaxation with nonnegativity instead of the
eigenvalue bound. An upper bound on the local activations of ANY placement at one layer,
for layers whose device sets cannot be listed (DeepSeek-V2-Lite: C(64, 8) = 4.4e9).

The figure bounded is `bound.py`'s: max over partitions P of the N experts into G blocks of
S = N / G of sum_t m_t, m_t = max_d h_td, h_td = |S_t ∩ P_d| (homes' capacity dropped, so it
bounds the capacity-bound exact-home figure too). The bound (ours):

1. a row's max block and its co-located pairs: pairs_t(P) = sum_d C(h_td, 2) >= c(m_t), c(m) =
   C(m, 2) + the fewest pairs the other k - m experts can form on G - 1 blocks of at most m
   (spread evenly); m_t lies in [ceil(k / G), min(k, S)]. So for any price b_t >= 0,
   m_t <= r_t(b_t) + b_t pairs_t(P), r_t(b) = max over those m of (m - b c(m)). Summed:
   sum_t m_t <= sum_t r_t(b_t) + 1/2 <A_b, X_P>, A_b = sum_t b_t (the pair graph of S_t) and
   X_P[e, f] = 1 where e and f share a block (diagonal 1). With one b for all rows this is the
   Lagrangian dual of the pair budget (`bound.budget_rows`, an LP in the levels); one a row
   (rows with the same expert set share it: the function is symmetric and convex in them)
   lets each row's gain rest on its own pairs;
2. X_P is positive semidefinite with eigenvalues S (G times) and 0, diag(X_P) = 1,
   X_P 1 = S 1 and X_P >= 0 entrywise. For any u, v in R^N and W >= 0 (symmetric, zero
   diagonal): 1/2 <A_b, X_P> <= 1/2 <A_b, X_P> + <W, X_P> = <M, X_P> + sum u + S sum v
   <= sum u + S sum v + S x (sum of the G largest eigenvalues of M), M = A_b / 2 - Diag(u)
   - (v 1' + 1 v') / 2 + W: the Lagrangian dual of the semidefinite relaxation of balanced
   graph partitioning with nonnegativity (Karisch and Rendl 1998, "Semidefinite programming
   and graph equipartition"; W = 0, v = 0 is Donath and Hoffman's eigenvalue bound).

So F(b, u, v, W) = sum_t r_t(b_t) + sum u + S sum v + S topG(M) bounds sum_t m_t for EVERY
b >= 0, u, v, W >= 0: the figure reported is the least F evaluated exactly at the iterates of
a minimisation (L-BFGS-B on a smoothed F: topG by its entropy-smoothed form, Fermi-Dirac
weights on the eigenvalues, and each r_t by a log-sum-exp, both above the exact ones, the
smoothing shrunk in phases). The optimiser only chooses the multipliers; validity rests on
the exact evaluation, not on convergence or tolerances.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, logsumexp, softmax
from threadpoolctl import threadpool_limits


@dataclass(frozen=True)
class RowPairConfig:
    """Knobs of the row-pair Lagrangian bound.

    smoothing: the phases' smoothing, each a fraction of (the starting bound / N) (the topG
        entropy weight and the rows' log-sum-exp temperature);
    iterations: L-BFGS-B iterations a phase;
    budget_s: CPU seconds of this process for one layer (checked between phases);
    nonnegativity: keep the W >= 0 multipliers (the semidefinite relaxation with X >= 0; off:
        the eigenvalue bound with row prices);
    triangles: the triangle inequalities X_ef + X_eg - X_fg <= 1 (each apex) of this many
        expert triples, the most co-activated, get multipliers too (0: none)."""

    smoothing: tuple[float, ...] = (0.03, 0.008, 0.0015, 0.0003)
    iterations: int = 150
    budget_s: float = 30.0
    nonnegativity: bool = True
    triangles: int = 0


def min_pairs(k: int, G: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    """(m int64[], c(m) float64[]): the feasible largest blocks m of a row of k experts on G
    blocks of S and the fewest co-located pairs a row whose largest block is m has."""
    ms, cs = [], []
    for m in range(-(-k // G), min(k, S) + 1):
        rest = k - m
        if G == 1:
            if rest:
                continue
            q, r = 0, 0
        else:
            q, r = divmod(rest, G - 1)
        if q > m or (q == m and r):
            continue
        ms.append(m)
        cs.append(m * (m - 1) / 2 + r * (q + 1) * q / 2 + (G - 1 - r) * q * (q - 1) / 2)
    return np.array(ms, np.int64), np.array(cs, np.float64)


def _top_smooth(lam: np.ndarray, G: int, mu: float) -> tuple[float, np.ndarray]:
    """(max over 0 <= y <= 1, sum y = G of y.lam + mu H(y) (H the binary entropy, >= 0, so the
    value is >= the sum of the G largest lam), its y float64[n]): Fermi-Dirac y = sigmoid((lam
    - theta) / mu), theta by bisection."""
    lo, hi = float(lam.min()) - 60 * mu, float(lam.max()) + 60 * mu
    for _ in range(60):
        th = (lo + hi) / 2
        if expit((lam - th) / mu).sum() > G:
            lo = th
        else:
            hi = th
    y = expit((lam - (lo + hi) / 2) / mu)
    ent = -(y * np.log(np.clip(y, 1e-300, 1)) + (1 - y) * np.log(np.clip(1 - y, 1e-300, 1)))
    return float(y @ lam + mu * ent.sum()), y


def row_pair_bound(experts: np.ndarray, N: int, G: int,
                   config: RowPairConfig = RowPairConfig(), b0: float | None = None) -> dict:
    """{"local": an upper bound on sum_t m_t (local activations, homes uncapacitated) of every
    placement of N experts on G devices of N / G at this layer, "seconds" (CPU), "evaluations"}.

    experts: int[T, k] one layer's routed experts (distinct within a row); b0: the rows'
    starting price (e.g. the pair budget's dual, `bound.budget_price`; 1 / 2 if None)."""
    with threadpool_limits(1):     # N x N eigensolves: threads only contend
        return _row_pair_bound(experts, N, G, config, b0)


def _row_pair_bound(experts: np.ndarray, N: int, G: int, config: RowPairConfig,
                    b0: float | None) -> dict:
    t0 = time.process_time()
    ex = np.sort(np.asarray(experts, np.int64), axis=1)
    T, k = ex.shape
    S = N // G
    ms, cm = min_pairs(k, G, S)
    if T == 0 or k < 2 or ms.size == 0:
        return {"local": float(T * min(k, S)), "seconds": 0.0, "evaluations": 0}
    sets, cnt = np.unique(ex, axis=0, return_counts=True)
    ng = sets.shape[0]
    i, j = np.triu_indices(k, 1)
    pid = sets[:, i] * N + sets[:, j]                         # int64[ng, C(k, 2)] pair ids
    w = cnt.astype(np.float64) / T                           # rows, normalised
    iu = np.triu_indices(N, 1)
    nW = iu[0].size if config.nonnegativity else 0
    msf = ms.astype(np.float64)
    tri = _top_triples(sets, w, N, config.triangles)          # int64[nT, 3]: apex first
    nT = tri.shape[0]
    te, tf, tg = (tri[:, c] for c in range(3))
    best = [np.inf]

    def F(z: np.ndarray, mu: float, tau: float) -> tuple[float, np.ndarray]:
        b, u, v = z[:ng], z[ng:ng + N], z[ng + N:ng + 2 * N]
        vals = msf[None, :] - b[:, None] * cm[None, :]         # [ng, levels]
        rows_exact = float(w @ vals.max(axis=1))
        rows_s = tau * logsumexp(vals / tau, axis=1)
        gb = -(softmax(vals / tau, axis=1) * cm[None, :]).sum(axis=1)
        Ab = np.bincount(pid.ravel(), weights=np.repeat(w * b, pid.shape[1]),
                         minlength=N * N).reshape(N, N)
        M = (Ab + Ab.T) / 2 - np.diag(u) - (v[:, None] + v[None, :]) / 2
        if nW:
            Wm = np.zeros((N, N))
            Wm[iu] = z[ng + 2 * N:ng + 2 * N + nW]
            M += Wm + Wm.T
        if nT:
            tau = z[ng + 2 * N + nW:] / 2
            np.add.at(M, (te, tf), -tau); np.add.at(M, (tf, te), -tau)
            np.add.at(M, (te, tg), -tau); np.add.at(M, (tg, te), -tau)
            np.add.at(M, (tf, tg), tau); np.add.at(M, (tg, tf), tau)
        lam, V = np.linalg.eigh(M)
        lin = float(u.sum() + S * v.sum() + z[ng + 2 * N + nW:].sum())
        best[0] = min(best[0], rows_exact + lin + S * float(lam[-G:].sum()))   # exact F
        top, y = _top_smooth(lam, G, mu)
        P = (V * y) @ V.T
        grads = [w * gb + w * S * P.ravel()[pid].sum(axis=1),
                 1 - S * np.diag(P), S - S * P.sum(axis=1)]
        if nW:
            grads.append(2 * S * P[iu])
        if nT:
            grads.append(1 + S * (P[tf, tg] - P[te, tf] - P[te, tg]))
        return float(w @ rows_s) + lin + S * top, np.concatenate(grads)

    z = np.concatenate([np.full(ng, 0.5 if b0 is None else b0), np.zeros(2 * N + nW + nT)])
    bounds = [(0, None)] * ng + [(None, None)] * (2 * N) + [(0, None)] * (nW + nT)
    F(z, 1.0, 1.0)
    scale = best[0] / N
    evals = 0
    for frac in config.smoothing:
        if time.process_time() - t0 > config.budget_s:
            break
        mu = frac * scale
        res = minimize(F, z, args=(mu, mu), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": config.iterations, "maxcor": 20})
        z, evals = res.x, evals + res.nfev
    local = min(best[0] * T * (1 + 1e-9), float(T * min(k, S)))
    return {"local": local, "seconds": time.process_time() - t0, "evaluations": evals}


def _top_triples(sets: np.ndarray, w: np.ndarray, N: int, n: int) -> np.ndarray:
    """int64[3 n', 3]: the n' <= n expert triples most co-activated in the rows (sets int64[ng,
    k] sorted, weights w float64[ng]), each with each of its experts as apex (first)."""
    if n <= 0 or sets.shape[1] < 3:
        return np.zeros((0, 3), np.int64)
    from itertools import combinations

    pick = np.array(list(combinations(range(sets.shape[1]), 3)), np.int64)
    t = sets[:, pick]                                        # [ng, C(k, 3), 3]
    key = (t[..., 0] * N + t[..., 1]) * N + t[..., 2]
    uniq, inv = np.unique(key.ravel(), return_inverse=True)
    weight = np.bincount(inv, weights=np.repeat(w, pick.shape[0]))
    top = uniq[np.argsort(-weight, kind="stable")[:n]]
    a, b, c = top // (N * N), top // N % N, top % N
    return np.concatenate([np.stack([a, b, c], 1), np.stack([b, a, c], 1),
                           np.stack([c, a, b], 1)]).astype(np.int64)
