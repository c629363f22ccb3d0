"""The device-configuration bound where its C(N, S) device sets cannot be listed: column
generation with an exact pricing scan and the Lagrangian (Farley) bound, valid at every scan.

`device_bound.config_bound` solves the configuration LP max sum_D w_D V(D) over every S-subset D
(each expert covered once) where C(N, S) is small. Here (ours):

1. the value is U(D) >= V(D) (`set_scan`: the layer's tp batches in `ColgenConfig.parts` runs,
   one cap a run, the sum of its batches' caps; one run a batch, the default, is V itself), so
   every figure below bounds V's LP too;
2. a restricted LP over the sets generated so far (HiGHS; "each expert at most once": the LP
   stays feasible with any columns, and a partition is still one of its points) gives prices
   mu_e >= 0;
3. pricing: swap searches (`set_scan.swap_search`) propose sets with U(D) - mu(D) > 0; when they
   find none, `set_scan.exact_scan` lists the best over ALL sets exactly (a pruned enumeration;
   out of nodes, it bounds the subtrees it did not enter instead: an upper bound on the best
   reduced cost, all step 4 needs);
4. the bound: for any prices mu, any partition P (each of whose sets meets the load cap) has
   sum_{D in P} U(D) = sum_e mu_e + sum_{D in P} (U(D) - mu(D)) <= sum_e mu_e + G x max_D
   (U(D) - mu(D)) (Lagrangian relaxation of "each expert on one device"; Farley 1990). Every
   finished exact scan gives one; the least is kept, so a loop stopped by its time budget still
   returns a valid bound. When the scan finds no improving set the LP is optimal and the bound
   equals its value.
5. anytime (ours, `slack_start`, for DeepSeek-V2-Lite's C(64, 8) sets, where one scan at the
   default floor costs minutes): a scan that finds no set above a floor f proves the bound
   sum mu + G f; the first floor is the one that would beat a bound already known (`target`),
   and each finished scan halves it while the CPU budget lasts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix

from sempar.placement.capacity import BATCH
from sempar.placement import set_scan


@dataclass(frozen=True)
class ColgenConfig:
    """Knobs of the column-generation bound.

    budget_s: CPU seconds of this process for one layer (after it, one last exact scan for the
        bound; CPU, not wall, so the figure does not depend on the machine's load);
    starts: swap searches per round (from the LP's positive sets, then random ones);
    scan_columns: sets an exact scan returns (all added when improving);
    max_nodes: nodes one exact scan may expand (over it the scan proves nothing: the layer keeps
        the other bounds); max_rounds: LP solves at most;
    slack: an exact scan only looks for sets above slack x LP value / G (it prunes far more),
        so a scan that finds none proves the bound within (1 + slack) of the LP's value;
    parts: the layer's tp batches split into this many runs, each with its own cap (`set_scan`:
        one a batch, 0, is the listed LP's V, tightest; fewer are cheaper to scan);
    swap_width: the swap search values exactly only this many incoming experts per outgoing one,
        the best by co-activation with the set less price (0: all; a pricing heuristic only);
    slack_start: 0 scans at `slack` only; above it, the first exact scan looks only for sets
        above slack_start x LP value / G (far cheaper: it prunes far more), and each scan that
        finishes with none proves a bound within (1 + its slack) of the LP's value, then the
        next scans lower the slack by `slack_step` down to `slack` while the budget lasts (an
        anytime bound where one scan at `slack` costs minutes: DeepSeek-V2-Lite's C(64, 8));
    target_share: given a bound to beat (`colgen_bound`'s target), the first floor proves
        LP value + target_share x (target - LP value), not above slack_start."""

    budget_s: float = 15.0
    starts: int = 8
    scan_columns: int = 32
    max_nodes: int = 30_000_000
    max_rounds: int = 400
    slack: float = 0.005
    parts: int = 0
    swap_width: int = 6
    slack_start: float = 0.0
    target_share: float = 0.85
    slack_step: float = 0.5


@dataclass(frozen=True)
class LayerRows:
    """One layer's rows for `set_scan`: groups of equal (part, expert set) (int64[n] `idx` by
    expert via `ptr` int64[N + 1], float64[n] `count`, int64[n] `part`), cnt1 float64[Q, N] rows
    per part and expert, A2 float64[Q, N, N] the parts' pair co-activation, C float64[Q] the
    parts' caps, M = min(k, S); load float64[N] each expert's rows (its load)."""

    ptr: np.ndarray
    idx: np.ndarray
    count: np.ndarray
    part: np.ndarray
    cnt1: np.ndarray
    A2: np.ndarray
    C: np.ndarray
    M: int

    @property
    def load(self) -> np.ndarray:
        return self.cnt1.sum(axis=0)


def layer_rows(experts: np.ndarray, N: int, G: int, batch: int = BATCH, parts: int = 1
               ) -> LayerRows:
    """`LayerRows` of experts int[T, k] (one layer) on G devices, tp batches of `batch` rows,
    split into `parts` runs of whole batches (at most one a batch; 0: one a batch)."""
    ex = np.sort(np.asarray(experts, np.int64), axis=1)
    T, k = ex.shape
    b = np.arange(T) // batch
    B = int(b[-1]) + 1 if T else 1
    Q = B if parts <= 0 else min(parts, B)
    q_of_b = np.arange(B) * Q // B
    q = q_of_b[b]
    uniq, cnt = np.unique(np.concatenate([q[:, None], ex], axis=1), axis=0, return_counts=True)
    flat = uniq[:, 1:].ravel()
    order = np.argsort(flat, kind="stable")
    ptr = np.searchsorted(flat[order], np.arange(N + 1)).astype(np.int64)
    caps = -(-np.bincount(b, minlength=B) // G)
    C = np.bincount(q_of_b, weights=caps, minlength=Q).astype(np.float64)
    cnt1 = np.stack([np.bincount(ex[q == j].ravel(), minlength=N) for j in range(Q)])
    A2 = np.stack([set_scan.coactivation(ex[q == j], N) for j in range(Q)])
    return LayerRows(ptr, (order // k).astype(np.int64), cnt.astype(np.float64),
                     uniq[:, 0].astype(np.int64), cnt1.astype(np.float64), A2, C,
                     min(k, N // G))


def colgen_bound(experts: np.ndarray, N: int, G: int, config: ColgenConfig = ColgenConfig(),
                 max_imbalance: float | None = None, start: np.ndarray | None = None,
                 batch: int = BATCH, seed: int = 0, target: float | None = None) -> dict | None:
    """{"local": an upper bound on the local activations of any placement of this layer (load
    imbalance <= max_imbalance when given) under tp's equal shares, "lp": the last LP's value,
    "proved": the LP's optimum reached, "scans", "rounds", "seconds", "witness": int64[N] the
    LP's rounded partition (experts in device order)}, or None where no exact scan finished.

    experts int[T, k]; start: int64[N] a partition in device order (slot // S = device), whose
    sets seed the LP (e.g. the solver's placement). target: a bound already known (local
    activations; e.g. the row-pair bound): with `slack_start`, the first scan's floor is set to
    prove a figure below it (`target_share` of the way from the LP's value), and None comes
    back at once where the LP's value is already above it (no bound here can beat it)."""
    t0, c0 = time.perf_counter(), time.process_time()
    S = N // G
    R = layer_rows(experts, N, G, batch, config.parts)
    load = R.load
    cap = np.inf if max_imbalance is None else \
        max_imbalance * load.sum() / G * (1 + 1e-12)
    rng = np.random.default_rng(seed)
    A = R.A2.sum(axis=0)                # the swap search's proxy
    cols: list[np.ndarray] = []
    vals: list[float] = []
    seen: set[bytes] = set()

    def add(member: np.ndarray, value: float | None = None) -> bool:
        key = member.tobytes()
        if key in seen or load[member].sum() > cap:
            return False
        seen.add(key)
        cols.append(member.copy())
        vals.append(set_scan.set_value(member, R.ptr, R.idx, R.count, R.part, R.C, R.M)
                    if value is None else value)
        return True

    if start is not None:
        for d in range(G):
            m = np.zeros(N, bool)
            m[np.asarray(start)[d * S:(d + 1) * S]] = True
            add(m)
    best, proved, scans, rounds = np.inf, False, 0, 0
    slack = max(config.slack_start, config.slack)
    value, w = 0.0, np.zeros(0)
    while rounds < config.max_rounds:
        rounds += 1
        if cols:
            res = linprog(-np.asarray(vals), A_ub=csr_matrix(np.stack(cols).T.astype(np.float64)),
                          b_ub=np.ones(N), bounds=(0, None), method="highs")
            if res.status != 0:
                return None
            value, w = -float(res.fun), res.x
            mu = np.maximum(-np.asarray(res.ineqlin.marginals, np.float64), 0.0)
        else:
            mu = np.zeros(N)
        tol = 1e-7 * max(value, 1.0)
        late = time.process_time() - c0 > config.budget_s
        found = 0
        if not late:
            starts = [cols[j] for j in np.argsort(-w)[: config.starts // 2] if w[j] > 1e-9]
            tries = 0
            while len(starts) < config.starts and tries < 4 * config.starts:
                tries += 1
                m = np.zeros(N, bool)
                m[rng.choice(N, S, replace=False)] = True
                if load[m].sum() <= cap:
                    starts.append(m)
            for s in starts:
                m, red = set_scan.swap_search(s, mu, load, cap, R.ptr, R.idx, R.count, R.part,
                                              R.C, R.M, 100, A, config.swap_width)
                if red > tol and add(m):
                    found += 1
            if found:
                continue
        if scans == 0 and target is not None and config.slack_start > 0:
            if value * (1 + config.slack) >= target:
                return None             # the LP is at least value: nothing here beats target
            slack = min(slack, max(config.slack,
                                   config.target_share * (target / max(value, 1e-12) - 1)))
        scans += 1
        floor = max(tol, slack * value / G)
        top, sets, exact, open_ub = _scan(R, S, mu, load, cap, config.scan_columns, floor,
                                          config.max_nodes)
        # none above the floor: the max is at most it; a scan out of nodes adds the bound of
        # the subtrees it left (set_scan.exact_scan)
        upper = max(float(top[0]), floor, float(open_ub))
        best = min(best, float(mu.sum()) + G * upper)
        if exact and upper <= floor:
            if slack <= config.slack or late:
                proved = slack <= config.slack
                break
            # proved within (1 + slack) of this LP: look again, for fewer sets, lower down
            slack *= config.slack_step
            if slack * value / G <= tol:        # below the tolerance: the last, at `slack`
                slack = config.slack
            slack = max(config.slack, slack)
            continue
        if late:
            break
        new = 0
        for v, s in zip(top, sets):
            if v > tol:
                m = np.zeros(N, bool)
                m[s] = True
                new += add(m)
        if not new:                       # an inexact scan with nothing to add: no progress
            break
    if not np.isfinite(best):
        return None
    witness = _round(cols, w, N, G) if cols and w.size else None
    return {"local": min(best * (1 + 1e-9), float(np.asarray(experts).size)), "lp": value,
            "proved": proved, "scans": scans, "rounds": rounds, "witness": witness,
            "seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def _scan(R: LayerRows, S: int, mu: np.ndarray, load: np.ndarray, cap: float, K: int,
          floor: float, max_nodes: int):
    """`set_scan.exact_scan` with the experts relabelled by decreasing load - mu (the most
    promising first: later subtrees then hold only poor candidates and are cut early); the sets
    come back in the original labels."""
    order = np.argsort(-(R.load - mu), kind="stable")
    # groups of new expert i are the groups of old expert order[i]
    ptr = np.concatenate([[0], np.cumsum(np.diff(R.ptr)[order])]).astype(np.int64)
    idx = np.concatenate([R.idx[R.ptr[o]:R.ptr[o + 1]] for o in order]).astype(np.int64)
    A2 = np.ascontiguousarray(R.A2[:, order][:, :, order])
    top, sets, exact, open_ub = set_scan.exact_scan(
        S, mu[order], load[order], cap, ptr, idx, R.count, R.part,
        np.ascontiguousarray(R.cnt1[:, order]), A2, R.C, R.M, K, floor, max_nodes)
    return top, np.where(sets >= 0, order[np.maximum(sets, 0)], -1), exact, open_ub


def _round(cols: list[np.ndarray], w: np.ndarray, N: int, G: int) -> np.ndarray:
    """int64[N]: the LP's sets by decreasing weight, each taken while disjoint from those
    taken; the experts left fill the remaining devices in id order."""
    used = np.zeros(N, bool)
    groups = []
    for j in np.argsort(-w, kind="stable"):
        if w[j] <= 1e-9 or len(groups) == G:
            break
        if not used[cols[j]].any():
            groups.append(np.flatnonzero(cols[j]))
            used[cols[j]] = True
    return np.concatenate([*groups, np.flatnonzero(~used)]).astype(np.int64)
