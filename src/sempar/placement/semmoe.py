"""`semmoe`: Sem-MoE's alternating model-data co-scheduling (its Appendix B, Algorithm 1).

Co-clusters = devices (E = G). Per MoE layer l, from the fit trace:
- `Cp[l]` float[U, N]: token -> expert confidence (§3.2), `a` float[U]: token frequency;
- request-expert affinity `Q[l]` float[R, N] = sum of Cp rows of the request's tokens;
- expert-expert affinity `A[l]` float[N, N] = Cp^T diag(a) Cp.

`expert_place` (Alg. 1 lines 3-26) visits experts by decreasing load and puts each on the
unsaturated cluster (N/E experts each) maximising
    alpha * EAF_e + beta * EAF_r - gamma * loads_cls
then runs `ft_steps` random pairwise swaps between clusters, kept when they raise the same
score. `request_schedule` (lines 28-42) visits requests by decreasing length and puts each on the
unsaturated cluster (K/E requests each) maximising alpha_r * RAF_r + beta_r * RAF_e, summed over
layers because a request keeps one DP rank through the whole model. The two alternate for
`n_steps` from an initial request clustering (line 44: balanced k-means of the requests'
expert-affinity vectors) and the pair with the best §3.3 objective is kept:
    L = theta * sum_i |tokens_i - S/E| + (1 - theta) * remote activations.

Choices where the paper is open (ours): every term is divided by its total so the weights are
comparable (EAF_e by A's total, EAF_r by Q's total, loads by the layer's total load); defaults
alpha = beta = gamma = 1, alpha_r = 0.5, beta_r = 1, theta = 0.5, n_steps = 4,
ft_steps = 20 * N. gamma trades locality for balance; measured on the tiny-moe64 dev trace
(20/80 split, tp mode, held-out LAR / max-mean imbalance): gamma 0.5 gives 0.385 / 1.14 at
EP 4 and 0.223 / 1.19 at EP 8; gamma 1 gives 0.360 / 1.05 and 0.219 / 1.06; gamma 2 gives
0.359 / 1.03 and 0.211 / 1.05. We take gamma = 1, the most local setting within the 1.10
imbalance budget. (We also tried a marginal greedy score, each term normalised per expert
and the load term counting only overflow above the mean: no better, not kept.)

Outputs besides the placement (in `info`): the fit requests' clusters and the token -> device
table T[l, token] with its confidence Tp (the share of the token's expected
activations at layer l that land on that device).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from sempar.placement.base import SOLVERS, PlacementProblem, coclustered_placement
from sempar.placement.placement import Placement

ALPHA, BETA, GAMMA = 1.0, 1.0, 1.0
ALPHA_R, BETA_R = 0.5, 1.0
THETA = 0.5
N_STEPS = 4


def affinity_tables(problem: PlacementProblem):
    """(tokens int64[U], Cp float32[L, U, N], a float64[U], Q float64[L, R, N], A float64[L, N, N],
    request ids int64[R], request lengths int64[R], token index int64[T], request index int64[T])."""
    t = problem.trace
    L, N = t.meta.num_layers, t.meta.num_experts
    tokens, tok = np.unique(t.token_id, return_inverse=True)
    reqs, req = np.unique(t.request_id, return_inverse=True)
    U, R = tokens.size, reqs.size
    a = np.bincount(tok, minlength=U).astype(np.float64)
    B = sparse.csr_matrix((np.ones(tok.size), (req, tok)), shape=(R, U))   # token counts per request
    Cp = np.empty((L, U, N), np.float32)
    Q = np.empty((L, R, N))
    A = np.empty((L, N, N))
    for l in range(L):
        key = tok[:, None] * N + t.experts[:, l]
        c = np.bincount(key.ravel(), minlength=U * N).reshape(U, N).astype(np.float64)
        cp = c / c.sum(axis=1, keepdims=True)
        Cp[l] = cp
        Q[l] = B @ cp
        A[l] = (cp * a[:, None]).T @ cp
        np.fill_diagonal(A[l], 0.0)
    lengths = np.bincount(req, minlength=R)
    return tokens, Cp, a, Q, A, reqs, lengths, tok, req


def expert_place(loads: np.ndarray, A: np.ndarray, Qc: np.ndarray, E: int,
                 rng: np.random.Generator, ft_steps: int) -> np.ndarray:
    """int64[N]: cluster of each expert for one layer (Alg. 1 lines 3-26).

    loads float[N]; A float[N, N]; Qc float[E, N] = request-expert affinity summed per cluster.
    """
    N = loads.size
    cap = N // E
    za, zr, zl = max(A.sum(), 1e-12), max(Qc.sum(), 1e-12), max(loads.sum(), 1e-12)
    member = np.zeros((E, N))
    cnt = np.zeros(E, np.int64)
    load_c = np.zeros(E)
    cls = np.empty(N, np.int64)
    for e in np.argsort(-loads, kind="stable"):
        score = (ALPHA * (member @ A[e]) / za + BETA * Qc[:, e] / zr - GAMMA * load_c / zl)
        score[cnt >= cap] = -np.inf
        c = int(np.argmax(score))
        cls[e] = c
        member[c, e] = 1.0
        cnt[c] += 1
        load_c[c] += loads[e]

    def gain(e1: int, e2: int) -> float:
        c1, c2 = cls[e1], cls[e2]
        d_aff = (A[e2] @ member[c1] - A[e2, e1] + A[e1] @ member[c2] - A[e1, e2]
                 - (A[e1] @ member[c1] + A[e2] @ member[c2]))
        d_req = Qc[c1, e2] + Qc[c2, e1] - Qc[c1, e1] - Qc[c2, e2]
        d = loads[e2] - loads[e1]
        mean = zl / E
        d_bal = (abs(load_c[c1] + d - mean) + abs(load_c[c2] - d - mean)
                 - abs(load_c[c1] - mean) - abs(load_c[c2] - mean))
        return ALPHA * d_aff / za + BETA * d_req / zr - GAMMA * d_bal / zl

    for _ in range(ft_steps if E > 1 else 0):
        c1, c2 = rng.choice(E, 2, replace=False)
        e1 = int(rng.choice(np.flatnonzero(cls == c1)))
        e2 = int(rng.choice(np.flatnonzero(cls == c2)))
        if gain(e1, e2) > 0:
            member[c1, e1] = member[c2, e2] = 0.0
            member[c1, e2] = member[c2, e1] = 1.0
            cls[e1], cls[e2] = c2, c1
            load_c[c1] += loads[e2] - loads[e1]
            load_c[c2] += loads[e1] - loads[e2]
    return cls


def request_schedule(Q: np.ndarray, ecls: np.ndarray, lengths: np.ndarray, E: int) -> np.ndarray:
    """int64[R]: cluster of each request (Alg. 1 lines 28-42), Q float[L, R, N], ecls int[L, N]."""
    L, R, N = Q.shape
    onehot = np.zeros((L, N, E))
    onehot[np.arange(L)[:, None], np.arange(N)[None, :], ecls] = 1.0
    raf_e = np.einsum("lrn,lne->re", Q, onehot)                   # activations local to each cluster
    vec = Q.transpose(1, 0, 2).reshape(R, L * N)
    vec = vec / np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
    cap = -(-R // E)
    sums = np.zeros((E, L * N))
    cnt = np.zeros(E, np.int64)
    out = np.empty(R, np.int64)
    for r in np.argsort(-lengths, kind="stable"):
        raf_r = sums @ vec[r] / max(cnt.max(), 1)
        e_term = raf_e[r] / max(raf_e[r].sum(), 1e-12)
        score = ALPHA_R * raf_r + BETA_R * e_term
        score[cnt >= cap] = -np.inf
        c = int(np.argmax(score))
        out[r] = c
        sums[c] += vec[r]
        cnt[c] += 1
    return out


def _initial_requests(Q: np.ndarray, lengths: np.ndarray, E: int, seed: int) -> np.ndarray:
    """Alg. 1 line 44: balanced k-means of the requests' expert-affinity vectors."""
    from sklearn.cluster import KMeans

    L, R, N = Q.shape
    vec = Q.transpose(1, 0, 2).reshape(R, L * N)
    vec = vec / np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
    if R < E:
        return np.arange(R) % E
    km = KMeans(n_clusters=E, n_init=3, random_state=seed).fit(vec)
    dist = km.transform(vec)                                       # [R, E]
    cap = -(-R // E)
    cnt = np.zeros(E, np.int64)
    out = np.empty(R, np.int64)
    for r in np.argsort(dist.min(axis=1), kind="stable"):
        order = np.argsort(dist[r])
        c = next(int(c) for c in order if cnt[c] < cap)
        out[r] = c
        cnt[c] += 1
    return out


def objective(Q: np.ndarray, ecls: np.ndarray, rcls: np.ndarray, lengths: np.ndarray,
              E: int) -> float:
    """Sem-MoE §3.3: theta * token imbalance + (1 - theta) * remote activations (fit data)."""
    L = Q.shape[0]
    local = sum((Q[l] * (ecls[l][None, :] == rcls[:, None])).sum() for l in range(L))
    remote = Q.sum() - local
    tokens = np.bincount(rcls, weights=lengths, minlength=E)
    imbalance = np.abs(tokens - lengths.sum() / E).sum() * L      # per layer, like the activations
    return THETA * imbalance + (1 - THETA) * remote


@SOLVERS.register("semmoe")
def semmoe(p: PlacementProblem) -> Placement:
    """Co-cluster experts and requests (one device per cluster); no replicas, nodes ignored."""
    from sempar.errors import InputError

    if p.redundant:
        raise InputError("semmoe: places every expert once; --redundant is not supported")
    meta = p.trace.meta
    L, N, E = meta.num_layers, meta.num_experts, p.num_devices
    rng = np.random.default_rng(p.seed)
    tokens, Cp, a, Q, A, reqs, lengths, tok, req = affinity_tables(p)
    loads = np.einsum("u,lun->ln", a, Cp)
    rcls = _initial_requests(Q, lengths, E, p.seed)
    best = None
    for step in range(N_STEPS):
        onehot_r = np.zeros((E, reqs.size))
        onehot_r[rcls, np.arange(reqs.size)] = 1.0
        ecls = np.stack([expert_place(loads[l], A[l], onehot_r @ Q[l], E, rng, 20 * N)
                         for l in range(L)])
        rcls = request_schedule(Q, ecls, lengths, E)
        score = objective(Q, ecls, rcls, lengths, E)
        if best is None or score < best[0]:
            best = (score, ecls.copy(), rcls.copy(), step)
    score, ecls, rcls, step = best
    return coclustered_placement(p, "semmoe", ecls, tokens, Cp, info={
        "objective": float(score), "best_step": int(step),
        "request_cluster": {"request_id": reqs.tolist(), "device": rcls.tolist()}})
