"""ILP placements: `exflow` (ExFlow, Yao et al. 2024, §IV-B..D, eqs. 8-12) and `moetuner`
(MoETuner, Go & Mahajan 2025, as summarised by Sem-MoE §2 / §4.3). Both solve with
`scipy.optimize.milp` (HiGHS) under a wall-clock `time_limit` and report in `info` the status,
the incumbent objective, the dual bound and the MIP gap of every ILP they ran.

Affinity. C_l[i, j] = number of (token, selection at layer l, selection at layer l+1) pairs with
expert i at l and j at l+1, over all k x k pairs of the token's selections
(`sempar.affinity.transitions.pair_counts`). ExFlow's models are top-1 (its R_{k,j} counts one
re-routing per token and layer), for which k x k pairs and top-1 coincide; `pairs="top1"` uses
only slot 0 instead.

ExFlow ILP (eqs. 8-12). x[l, e, p] in {0, 1}: expert e of layer l on bin p (node in stage 1,
GPU in stage 2); sum_e x[l, e, p] = E / P (eq. 9); sum_p x[l, e, p] = 1 (eq. 10). The paper
minimises sum_k sum_j R_{k,j} with R >= x_i^p - x_{i'}^p (eqs. 11-12), R the token's
re-routing. Tokens with the same (i at l, j at l+1) share one R, so we aggregate them into one
weight C_l[i, j] and use the equivalent "same-bin" form: maximise sum C_l[i, j] y[l, i, j, p]
with y <= x[l, i, p], y <= x[l+1, j, p] (0 <= y <= 1 continuous; integral at an optimum):
re-routed = total - sum y, so min sum R == max sum C y.
Staged (§IV-C, "in stage 1, we will reduce the inter-node routing ... in stage 2, we will
minimize the intra-node routing based on stage 1 results"): with num_nodes > 1 the same ILP is
solved with nodes as bins, then per node with its GPUs as bins over the experts stage 1 put there.

Size. A pair of free layers needs nnz(C) * P y columns and twice as many rows; the whole chain
(L-1 pairs) is solved at once only when it fits `max_pair_vars` (each free-free pair keeps only
its KEEP_PAIRS * n heaviest (i, j) entries, the rest drop out of the objective). Otherwise layers are solved in
windows of w consecutive free layers (w - 1 free-free pairs fit the budget), each window's
predecessor layer fixed to the previous window's result (its pair with the window's first layer
is then linear in x, no y). The first window includes layer 0, so layer 0 is chosen jointly with
its successors; w = 1 means layer 0 is contiguous and every later layer is an exact
transportation-like ILP given its predecessor. The time limit is split across the ILPs in
proportion to their size. GPU-relabelling symmetry is broken in any window without a fixed
predecessor: expert e of its first layer may only go to bins 0..e.

Default `window=1` (layer 0 contiguous, then one exact ILP per layer given its predecessor, which
HiGHS closes at the root): on the tiny-moe64 dev trace at EP 4 the joint windows (`window=2`, or
all 6 layers with the 4 * N heaviest pairs per layer pair) stopped at a 10-20 s limit with gaps
0.3-117 and incumbents below the chain (fit locality 0.28 vs 0.43), so the joint form is kept as
an option (`window=None` or k) for small N only. The MoETuner MIP gap is relative to its whole
objective (about lam per layer plus the traffic shares), so it reads small.

Time limit. When an ILP stops at the limit its best incumbent is used and its gap reported;
with no incumbent the window falls back to `greedy`: layer by layer, experts in order of
decreasing affinity mass, each on the bin holding the most affinity from its predecessors
(C_l[:, j] summed over the experts already there) that still has capacity ("fallback": "greedy"
in that ILP's entry of `info["ilps"]`).

Incremental warm start (`batches` > 1). ExFlow §V-G shows that thousands of tokens capture the
affinity; we solve on growing prefixes of the fit tokens (1/b, 2/b, ..., all) and keep, at each
step, the better of the new ILP's incumbent and the previous step's placement, both scored on the
current counts. scipy's HiGHS binding takes no MIP start, so the previous solution is not handed
to the solver: it is only the incumbent we keep if the new solve does worse or finds nothing
(and it replaces the greedy fallback). The time limit is split evenly over the steps.

`moetuner` (MoETuner, the same machinery with a load term) lives in `placement/moetuner.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from sempar.affinity.transitions import pair_counts
from sempar.errors import InputError
from sempar.placement.base import SOLVERS, PlacementProblem
from sempar.placement.placement import Placement

TIME_LIMIT = 10.0        # seconds, whole solver (split across stages / windows / batches)
MAX_PAIR_VARS = 40_000   # y columns of one ILP (free-free layer pairs)
MIN_ILP_TIME = 0.05      # seconds: no ILP gets less
WINDOW = 1               # free layers per ILP (None: as many as MAX_PAIR_VARS allows)
KEEP_PAIRS = 4           # per free-free layer pair, only the KEEP_PAIRS * n heaviest (i, j) pairs


def affinity_counts(experts: np.ndarray, num_experts: int, pairs: str = "all") -> np.ndarray:
    """float64[L-1, N, N]: C[l, i, j] = pairs (i at layer l, j at layer l+1) over the tokens."""
    if pairs not in ("all", "top1"):
        raise InputError(f"pairs: {pairs!r} is not 'all' or 'top1'")
    ex = experts if pairs == "all" else experts[:, :, :1]
    L = ex.shape[1]
    out = np.zeros((max(L - 1, 0), num_experts, num_experts))
    for l in range(L - 1):
        out[l] = pair_counts(ex[:, l], ex[:, l + 1], num_experts)
    return out


def kept_affinity(assign: np.ndarray, C: np.ndarray) -> float:
    """Sum of C[l, i, j] over pairs whose experts share a bin (assign: int[L, n] bin per expert)."""
    return float(sum(C[l][assign[l][:, None] == assign[l + 1][None, :]].sum()
                     for l in range(C.shape[0])))


@dataclass
class _Window:
    """Layers lo..hi-1 free; `fixed` (bin per item of layer lo-1) or None."""
    lo: int
    hi: int
    fixed: np.ndarray | None


def _greedy(C: np.ndarray, P: int, cap: int, fixed: np.ndarray | None, lo: int, hi: int,
            load: np.ndarray | None = None) -> np.ndarray:
    """int[hi-lo, n]: layer by layer, each item on the bin with most predecessor affinity."""
    n = C.shape[1]
    out = np.zeros((hi - lo, n), np.int64)
    prev = fixed
    for t, l in enumerate(range(lo, hi)):
        if prev is None and load is None:
            row = np.arange(n) * P // n                          # contiguous
        else:
            W = np.zeros((P, n)) if prev is None else \
                np.stack([C[l - 1][prev == b].sum(axis=0) for b in range(P)])   # [P, n]
            row = np.full(n, -1)
            used = np.zeros(P, int)
            gl = np.zeros(P)
            if load is not None:             # moetuner: heaviest first, least-loaded bin first
                seq = np.argsort(-load[l], kind="stable")
            else:
                seq = np.argsort(-W.max(axis=0), kind="stable")
            for j in seq:
                pref = np.lexsort((-W[:, j], gl)) if load is not None else \
                    np.argsort(-W[:, j], kind="stable")
                for b in pref:
                    if used[b] < cap:
                        row[j] = b
                        used[b] += 1
                        if load is not None:
                            gl[b] += load[l, j]
                        break
        out[t] = row
        prev = row
    return out


def _build_and_solve(C: np.ndarray, P: int, cap: int, win: _Window, time_limit: float,
                     load: np.ndarray | None = None, lam: float = 0.0,
                     keep_pairs: int = 1 << 30) -> tuple[np.ndarray | None, dict]:
    """One ILP over the window's free layers. Returns (assign int[m, n] or None, info)."""
    n = C.shape[1]
    m = win.hi - win.lo
    nx = m * n * P

    def xi(t, e, p):
        return (t * n + e) * P + p
    cols_c: list[np.ndarray] = [np.zeros(nx)]
    rows, cols, vals, lb, ub = [], [], [], [], []
    r = 0

    def add_rows(rr, cc, vv, lo_, hi_):
        nonlocal r
        rows.append(np.asarray(rr) + r)
        cols.append(np.asarray(cc))
        vals.append(np.asarray(vv, float))
        k = int(np.max(rr)) + 1 if len(rr) else 0
        lb.append(np.full(k, lo_, float) if np.isscalar(lo_) else lo_)
        ub.append(np.full(k, hi_, float) if np.isscalar(hi_) else hi_)
        r += k

    T_, E_, P_ = np.meshgrid(np.arange(m), np.arange(n), np.arange(P), indexing="ij")
    ix = xi(T_, E_, P_)
    # eq. 9: sum_e x[t, e, p] = cap
    add_rows((T_ * P + P_).ravel(), ix.ravel(), np.ones(nx), cap, cap)
    # eq. 10: sum_p x[t, e, p] = 1
    add_rows((T_ * n + E_).ravel(), ix.ravel(), np.ones(nx), 1, 1)
    xub = np.ones(nx)
    if win.fixed is None:   # symmetry: item e of the first free layer on bins 0..e
        e0, p0 = np.meshgrid(np.arange(n), np.arange(P), indexing="ij")
        xub[xi(0, e0, p0)[p0 > e0]] = 0
    scale = {}
    total_c = 0.0
    ncol = nx
    # fixed predecessor: linear term -C[lo-1][i, j] x[0, j, fixed[i]]
    c = cols_c[0]
    if win.fixed is not None and win.lo >= 1:
        Cl = C[win.lo - 1]
        s = 1.0 / max(Cl.sum(), 1.0) if load is not None else 1.0
        W = np.stack([Cl[win.fixed == b].sum(axis=0) for b in range(P)])   # [P, n]
        for b in range(P):
            c[xi(0, np.arange(n), b)] -= s * W[b]
        total_c += Cl.sum() * s
        scale[win.lo - 1] = s
    # free-free pairs: y[i, j, p] <= x[t, i, p], y <= x[t+1, j, p]
    ycost = []
    for t in range(m - 1):
        Cl = C[win.lo + t]
        s = 1.0 / max(Cl.sum(), 1.0) if load is not None else 1.0
        ii, jj = np.nonzero(Cl)
        if ii.size > keep_pairs:                 # the heaviest pairs only (ties: lower ids)
            top = np.argsort(-Cl[ii, jj], kind="stable")[:keep_pairs]
            ii, jj = ii[top], jj[top]
        k = ii.size
        pp = np.repeat(np.arange(P)[None, :], k, axis=0).ravel()
        ir, jr = np.repeat(ii, P), np.repeat(jj, P)
        yid = ncol + np.arange(k * P)
        ncol += k * P
        ycost.append(-s * np.repeat(Cl[ii, jj], P))
        kk = np.arange(k * P)
        add_rows(np.concatenate([kk, kk]), np.concatenate([yid, xi(t, ir, pp)]),
                 np.concatenate([np.ones(k * P), -np.ones(k * P)]), -np.inf, 0)
        add_rows(np.concatenate([kk, kk]), np.concatenate([yid, xi(t + 1, jr, pp)]),
                 np.concatenate([np.ones(k * P), -np.ones(k * P)]), -np.inf, 0)
        total_c += Cl.sum() * s
    nz = 0
    if load is not None:    # moetuner: z_t >= sum_e w[e] x[t, e, g]
        nz = m
        zid = ncol + np.arange(m)
        ncol += m
        for t in range(m):
            w = load[win.lo + t].astype(float)
            Pg, Eg = np.meshgrid(np.arange(P), np.arange(n), indexing="ij")
            add_rows(np.concatenate([Pg.ravel(), np.arange(P)]),
                     np.concatenate([xi(t, Eg, Pg).ravel(), np.full(P, zid[t])]),
                     np.concatenate([w[Eg].ravel(), -np.ones(P)]), -np.inf, 0)
        zcost = np.array([lam / max(load[win.lo + t].sum() / P, 1.0) for t in range(m)])
    cost = np.concatenate([c] + ycost + ([zcost] if nz else []))
    A = sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(r, ncol))
    integrality = np.concatenate([np.ones(nx), np.zeros(ncol - nx)])
    upper = np.concatenate([xub, np.ones(ncol - nx - nz), np.full(nz, np.inf)])
    t0 = time.perf_counter()
    res = milp(cost, constraints=LinearConstraint(A, np.concatenate(lb), np.concatenate(ub)),
               integrality=integrality, bounds=Bounds(np.zeros(ncol), upper),
               options={"time_limit": max(time_limit, MIN_ILP_TIME), "disp": False})
    info = {"layers": [win.lo, win.hi], "columns": int(ncol), "rows": int(r),
            "status": int(res.status), "message": str(res.message),
            "seconds": round(time.perf_counter() - t0, 3),
            "mip_gap": None if getattr(res, "mip_gap", None) is None else float(res.mip_gap),
            "dual_bound": None if getattr(res, "mip_dual_bound", None) is None
            else float(res.mip_dual_bound),
            "objective": None if res.fun is None else float(res.fun)}
    if res.x is None:
        return None, info
    xs = res.x[:nx].reshape(m, n, P)
    assign = xs.argmax(axis=2)
    if not all((np.bincount(a, minlength=P) == cap).all() for a in assign):
        info["message"] += " (rounded incumbent breaks capacity)"
        return None, info
    return assign, info


def _window_kept(a: np.ndarray, fixed: np.ndarray | None, C: np.ndarray, lo: int,
                 hi: int) -> float:
    """Kept affinity of a window's assignment, its fixed predecessor pair included."""
    if fixed is None:
        return kept_affinity(a, C[lo:hi - 1])
    return kept_affinity(np.concatenate([fixed[None], a]), C[lo - 1:hi - 1])


def _window_plan(C: np.ndarray, L: int, P: int, max_pair_vars: int,
                 window: int | None, keep_pairs: int) -> int:
    if window is not None:
        return max(1, min(window, L))
    per_pair = max((min(int(np.count_nonzero(C[l])), keep_pairs) * P for l in range(C.shape[0])),
                   default=0)
    if per_pair == 0:
        return L
    return max(1, min(L, 1 + max_pair_vars // per_pair))


def solve_chain(C: np.ndarray, P: int, cap: int, time_limit: float, ilps: list,
                 load: np.ndarray | None = None, lam: float = 0.0,
                 max_pair_vars: int = MAX_PAIR_VARS, window: int | None = None,
                 previous: np.ndarray | None = None, tag: str = "",
                 keep_pairs_per_item: int = KEEP_PAIRS) -> np.ndarray:
    """int[L, n]: bin per item per layer for the whole chain, window by window."""
    L = C.shape[0] + 1
    if P == 1:
        return np.zeros((L, C.shape[1]), np.int64)
    n = C.shape[1]
    keep_pairs = keep_pairs_per_item * n
    w = _window_plan(C, L, P, max_pair_vars, window, keep_pairs)
    wins = [(lo, min(lo + w, L)) for lo in range(0, L, w)]
    sizes = np.array([(hi - lo) + (hi - lo - 1) * 4 + (lo > 0) for lo, hi in wins], float)
    budget = time_limit * sizes / sizes.sum()
    out = np.zeros((L, C.shape[1]), np.int64)
    deadline = time.perf_counter() + time_limit
    for k, (lo, hi) in enumerate(wins):
        fixed = out[lo - 1] if lo > 0 else None
        if fixed is None and hi - lo == 1:       # a lone first layer: nothing to optimise
            out[lo] = np.arange(n) * P // n if load is None else _greedy(C, P, cap, None, lo, hi, load)[0]
            continue
        left = deadline - time.perf_counter()
        rest = budget[k:].sum()
        tl = max(MIN_ILP_TIME, left * budget[k] / rest) if rest > 0 else MIN_ILP_TIME
        assign, info = _build_and_solve(C, P, cap, _Window(lo, hi, fixed), tl, load, lam,
                                        keep_pairs)
        info["stage"] = tag
        if assign is None:
            if previous is not None:
                assign = previous[lo:hi]
                info["fallback"] = "previous batch"
            else:
                assign = _greedy(C, P, cap, fixed, lo, hi, load)
                info["fallback"] = "greedy" if load is None else "greedy (load first)"
        elif load is None:   # an early-stopped incumbent can be worse than the greedy chain
            alt = _greedy(C, P, cap, fixed, lo, hi)
            if _window_kept(alt, fixed, C, lo, hi) > _window_kept(assign, fixed, C, lo, hi):
                assign = alt
                info["fallback"] = "greedy (better than the incumbent)"
        out[lo:hi] = assign
        ilps.append(info)
    return out


def chain_status(ilps: list) -> str:
    if any("fallback" in i for i in ilps):
        return "fallback"
    return "optimal" if all(i["status"] == 0 for i in ilps) else "time_limit"


def gpu_placement(gpu: np.ndarray, p: PlacementProblem, info: dict) -> Placement:
    L, N = gpu.shape
    G = p.num_devices
    phy = np.stack([np.argsort(gpu[l] * N + np.arange(N), kind="stable") for l in range(L)])
    return Placement(phy.astype(np.int32), N, G, p.node_of(), info=info)


def _exflow_once(C: np.ndarray, p: PlacementProblem, time_limit: float, ilps: list,
                 max_pair_vars: int, window: int | None, previous: np.ndarray | None,
                 step: int) -> np.ndarray:
    N, G, M = p.trace.meta.num_experts, p.num_devices, p.num_nodes
    L = p.trace.meta.num_layers
    if M == 1:
        return solve_chain(C, G, N // G, time_limit, ilps, max_pair_vars=max_pair_vars,
                            window=window, previous=previous, tag=f"batch {step}: gpus")
    t0 = time.perf_counter()
    prev_node = None if previous is None else previous // (G // M)
    node = solve_chain(C, M, N // M, time_limit / 2, ilps, max_pair_vars=max_pair_vars,
                        window=window, previous=prev_node, tag=f"batch {step}: nodes")
    gpu = np.zeros((L, N), np.int64)
    gpn, per_node = G // M, N // M
    for b in range(M):
        left = time_limit - (time.perf_counter() - t0)
        members = np.stack([np.nonzero(node[l] == b)[0] for l in range(L)])   # [L, N/M]
        Cb = np.stack([C[l][np.ix_(members[l], members[l + 1])] for l in range(L - 1)]) \
            if L > 1 else np.zeros((0, per_node, per_node))
        prev_b = None
        if previous is not None and (prev_node == node).all():
            prev_b = np.stack([previous[l, members[l]] - b * gpn for l in range(L)])
        local = solve_chain(Cb, gpn, N // G, left / (M - b), ilps,
                             max_pair_vars=max_pair_vars, window=window, previous=prev_b,
                             tag=f"batch {step}: node {b} gpus")
        for l in range(L):
            gpu[l, members[l]] = b * gpn + local[l]
    return gpu


@SOLVERS.register("exflow", replicas=False, preserves_groups=False, mode_aware=False)
def exflow(p: PlacementProblem, time_limit: float = TIME_LIMIT, pairs: str = "all",
           batches: int = 1, max_pair_vars: int = MAX_PAIR_VARS,
           window: int | None = WINDOW) -> Placement:
    """ExFlow's staged affinity ILP (eqs. 8-12); see the module docstring."""
    t = p.trace
    N = t.meta.num_experts
    rng = np.random.default_rng(p.seed)
    order = rng.permutation(t.num_tokens)            # token sample order for the batches
    t0 = time.perf_counter()
    ilps: list = []
    gpu = None
    steps = []
    for step in range(1, batches + 1):
        take = order[: max(1, t.num_tokens * step // batches)]
        C = affinity_counts(t.experts[take], N, pairs)
        left = time_limit - (time.perf_counter() - t0)
        cand = _exflow_once(C, p, left / (batches - step + 1), ilps, max_pair_vars, window,
                            gpu, step)
        if gpu is not None and kept_affinity(gpu, C) > kept_affinity(cand, C):
            cand = gpu
            steps.append({"tokens": int(take.size), "kept": "previous"})
        else:
            steps.append({"tokens": int(take.size), "kept": "new"})
        gpu = cand
    C = affinity_counts(t.experts, N, pairs)
    kept = kept_affinity(gpu, C)
    info = {"solver": "scipy.optimize.milp (HiGHS)", "time_limit": time_limit, "pairs": pairs,
            "status": chain_status(ilps), "objective_kept_pairs": kept,
            "inter_layer_locality": kept / max(C.sum(), 1.0),
            "mip_gap_max": max((i["mip_gap"] for i in ilps if i["mip_gap"] is not None),
                               default=None),
            "seconds": round(time.perf_counter() - t0, 3), "batches": steps, "ilps": ilps}
    return gpu_placement(gpu, p, info)
