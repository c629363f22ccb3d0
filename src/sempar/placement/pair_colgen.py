"""The most co-activation weight any balanced partition keeps on one device (Pi* of the pair
budget, `bound.py` step 2), bounded by column generation on the set-partitioning LP.

Pi(P) = sum over devices d of the weight A[e, f] of the expert pairs inside device d's set D_d.
Relaxed to the LP max sum_D w_D Pi(D) over S-subsets D (w >= 0, each expert covered once, D's
load at most the cap when one is given), the Dantzig-Wolfe relaxation of balanced graph
partitioning (the configuration bound of Mehrotra and Trick 1998, "Cliques and clustering: a
combinatorial approach", for clique partitioning), far tighter than the star and eigenvalue
bounds on real routing. The LP has C(N, S) columns; only a few are generated:

1. a restricted LP over the columns so far (HiGHS) gives prices mu_e of "e on one device";
2. pricing: a set D with Pi(D) - mu(D) > 0 improves the LP. Swaps (one expert out, one in) from
   many starts find such sets cheaply; when they find none, a HiGHS MILP (the quadratic
   knapsack max y'Ay/2 - mu y, |y| = S, linearised with the reformulation-linearisation
   equalities sum_f p[e, f] = (S - 1) y_e) either finds one or bounds the maximum from above;
3. the bound: for ANY prices mu, every device's set gains at most U >= max_D Pi(D) - mu(D), so
   Pi(P) <= sum_e mu_e + G U for every partition P (Lagrangian relaxation of "each expert on
   one device"; Farley's bound). It is valid at every MILP call, optimal LP or not, so the
   loop may stop at its time budget with a valid (looser) figure; the least one is kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix, csr_matrix, vstack


@dataclass(frozen=True)
class PairCGConfig:
    """Knobs of the column generation.

    budget_s: wall seconds for one layer's loop (the last valid bound is kept when it runs out);
    milp_time_s: HiGHS's limit for one exact pricing (a stopped MILP's dual bound is still valid);
    starts: swap searches per iteration (from the LP's positive columns, then random sets);
    max_iter: LP solves at most."""

    budget_s: float = 30.0
    milp_time_s: float = 10.0
    starts: int = 24
    max_iter: int = 200


def swap_search(A: np.ndarray, mu: np.ndarray, start: np.ndarray, load=None, cap=None,
                max_passes: int = 100) -> tuple[np.ndarray, float]:
    """(bool[N] a set of |start| experts, its Pi(D) - mu(D)) by best-improvement swaps from
    `start` bool[N]; with load float64[N] and cap, only sets whose load is <= cap (start must
    be). A heuristic: it proves nothing."""
    cur = start.copy()
    for _ in range(max_passes):
        s = A[:, cur].sum(axis=1)                          # weight to the set, per expert
        ins, outs = np.flatnonzero(cur), np.flatnonzero(~cur)
        # swap a (in) -> b (out): + s[b] - A[b, a] - s[a] - mu[b] + mu[a]
        gain = (s[outs][None, :] - A[np.ix_(ins, outs)] - s[ins][:, None]
                - mu[outs][None, :] + mu[ins][:, None])
        if load is not None:
            new = load[cur].sum() - load[ins][:, None] + load[outs][None, :]
            gain = np.where(new <= cap, gain, -np.inf)
        i, j = np.unravel_index(int(np.argmax(gain)), gain.shape)
        if gain[i, j] <= 1e-9:
            break
        cur[ins[i]], cur[outs[j]] = False, True
    return cur, set_value(A, cur) - float(mu[cur].sum())


def set_value(A: np.ndarray, member: np.ndarray) -> float:
    """Pi(D): the weight of the pairs inside D (member bool[N])."""
    return float(A[np.ix_(member, member)].sum() / 2)


def exact_pricing(A: np.ndarray, mu: np.ndarray, S: int, load=None, cap=None,
                  time_limit_s: float = 10.0) -> tuple[float, np.ndarray | None]:
    """(an upper bound on max over S-sets D (load <= cap) of Pi(D) - mu(D): HiGHS's dual bound,
    the optimum when it finishes; +inf where it gives none, the best set it found or None).
    Variables y_e (binary), p_ef = y_e y_f for the pairs with A[e, f] > 0 (p <= y_e, p <= y_f,
    sum_f p_ef <= (S - 1) y_e: at most S - 1 partners, tight for binary y)."""
    N = A.shape[0]
    e, f = np.triu_indices(N, 1)
    keep = A[e, f] > 0
    e, f = e[keep], f[keep]
    P = e.size
    nv = N + P
    cost = np.concatenate([mu, -A[e, f]])
    r = np.arange(P)
    rows = [coo_matrix((np.concatenate([np.ones(P), -np.ones(P)]),
                        (np.tile(r, 2), np.concatenate([N + r, e]))), shape=(P, nv)),
            coo_matrix((np.concatenate([np.ones(P), -np.ones(P)]),
                        (np.tile(r, 2), np.concatenate([N + r, f]))), shape=(P, nv))]
    # sum over partners f of p_ef - (S - 1) y_e <= 0, one row per expert
    pe = np.concatenate([e, f])
    rows.append(coo_matrix((np.concatenate([np.ones(2 * P), -(S - 1) * np.ones(N)]),
                            (np.concatenate([pe, np.arange(N)]),
                             np.concatenate([N + np.tile(r, 2), np.arange(N)]))),
                           shape=(N, nv)))
    card = np.zeros((1, nv)); card[0, :N] = 1
    rows.append(coo_matrix(card))
    lo = [np.full(P, -np.inf), np.full(P, -np.inf), np.full(N, -np.inf), [S]]
    hi = [np.zeros(P), np.zeros(P), np.zeros(N), [S]]
    if load is not None:
        lr = np.zeros((1, nv)); lr[0, :N] = load
        rows.append(coo_matrix(lr)); lo.append([-np.inf]); hi.append([cap])
    res = milp(cost, constraints=LinearConstraint(vstack(rows).tocsr(), np.concatenate(lo),
                                                  np.concatenate(hi)),
               integrality=np.concatenate([np.ones(N), np.zeros(P)]),
               bounds=Bounds(np.zeros(nv), np.ones(nv)),
               options={"time_limit": time_limit_s, "disp": False})
    dual = getattr(res, "mip_dual_bound", None)
    if dual is None or not np.isfinite(dual):
        return np.inf, None
    best = None if res.x is None else res.x[:N] > 0.5
    return -float(dual), best


def _restricted_lp(cols: list[np.ndarray], vals: list[float], N: int):
    """(LP value, mu float64[N], w float64[n]) of max sum w_D Pi(D) over the columns so far."""
    M = np.stack(cols).T.astype(np.float64)                # [N, n]
    res = linprog(-np.asarray(vals), A_eq=csr_matrix(M), b_eq=np.ones(N), bounds=(0, None),
                  method="highs")
    if res.status != 0:
        return None
    return -float(res.fun), -np.asarray(res.eqlin.marginals, np.float64), res.x


def pair_cg_bound(A: np.ndarray, G: int, load: np.ndarray | None = None,
                  cap: float | None = None, start: np.ndarray | None = None,
                  config: PairCGConfig = PairCGConfig(), seed: int = 0) -> dict | None:
    """{"pairs": an upper bound on Pi(P) of every partition of A's N experts into G sets of
    S = N / G (each of load <= cap when load float64[N] and cap are given), "lp": the last
    restricted LP's value (a lower estimate of the LP's), "proved": whether pricing proved the
    LP optimal, "iterations", "seconds"}, or None where no valid bound came out in the budget.

    start: int64[N] a partition (experts in device order, slot // S = device) meeting the cap
    (e.g. the solver's placement): its sets seed the LP (experts in id order otherwise, which
    then must meet the cap)."""
    t0 = time.perf_counter()
    N = A.shape[0]
    S = N // G
    rng = np.random.default_rng(seed)
    order = np.arange(N) if start is None else np.asarray(start, np.int64)
    cols, vals, seen = [], [], set()

    def add(member: np.ndarray) -> bool:
        key = member.tobytes()
        if key in seen:
            return False
        seen.add(key)
        cols.append(member.copy())
        vals.append(set_value(A, member))
        return True

    for d in range(G):
        m = np.zeros(N, bool); m[order[d * S:(d + 1) * S]] = True
        add(m)
    best, proved, it = np.inf, False, 0
    while it < config.max_iter:
        it += 1
        lp = _restricted_lp(cols, vals, N)
        if lp is None:
            return None
        value, mu, w = lp
        starts = [cols[j] for j in np.argsort(-w)[: config.starts // 2] if w[j] > 1e-9]
        while len(starts) < config.starts:
            m = np.zeros(N, bool); m[rng.choice(N, S, replace=False)] = True
            if load is None or load[m].sum() <= cap:
                starts.append(m)
            elif not starts:
                break
        found = 0
        for s in starts:
            m, red = swap_search(A, mu, s, load, cap)
            if red > 1e-6 * max(value, 1.0) / G and add(m):
                found += 1
        out_of_time = time.perf_counter() - t0 > config.budget_s
        if found and not out_of_time:
            continue
        upper, m = exact_pricing(A, mu, S, load, cap, config.milp_time_s)
        if np.isfinite(upper):
            best = min(best, float(mu.sum() + G * max(upper, 0.0)))
        if m is not None and set_value(A, m) - mu[m].sum() > 1e-6 * max(value, 1.0) / G \
                and add(m) and not out_of_time:
            continue
        proved = bool(upper <= 1e-6 * max(value, 1.0) / G)
        break
    if not np.isfinite(best):
        return None
    return {"pairs": best * (1 + 1e-9), "lp": value, "proved": proved, "iterations": it,
            "seconds": time.perf_counter() - t0}
