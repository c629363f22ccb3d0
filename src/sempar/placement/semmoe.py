"""`semmoe`: Sem-MoE's alternating model-data co-scheduling (its Appendix B, Algorithm 1).

Co-clusters = devices (E = G). Per MoE layer l, from the fit trace:
- `Cp[l]` float[U, N]: token -> expert confidence (§3.2), `a` float[U]: token frequency;
- request-expert affinity `Q[l]` float[R, N] = sum of Cp rows of the request's tokens;
- expert-expert affinity `A[l]` float[N, N] = Cp^T diag(a) Cp.

`expert_place_layers` (Alg. 1 lines 3-26, all layers at once) visits experts by decreasing load and puts each on the
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
imbalance budget. A marginal greedy score (each term normalised per expert, the load term
counting only overflow above the mean) measured no better.

Scaling (ours; the target is DeepSeek-V3's shape: 58 layers x 256 experts, EP 64, 2M fit
tokens, 128k distinct tokens, 7.8k requests, in <= 120 s and 8 GB):
- statistics come one layer at a time from `AffinityStats` (sparse Cp; Q float32[L, R, N] and
  A float64[L, N, N] are the only tables kept for all layers: 0.46 GB and 30 MB at that shape,
  besides the cached sparse counts, 0.63 GB);
- request vectors: the request's Q rows over all layers, L2-normalised, are R x (L N) = 7.8k x
  14.8k there. When L N > `EXACT_MAX_DIM` (1024) the initial k-means (line 44) and RAF_r (the
  request-request affinity, a dot product of those unit vectors) use a seeded Gaussian random
  projection to `PROJ_DIM` (256) dimensions instead, divided by the exact norms: inner products
  of unit vectors are kept to about +-1/sqrt(256) = 0.06 (Johnson-Lindenstrauss). The
  projection is one 60 GFLOP pass (float32 GEMMs, layer by layer); on the raw vectors k-means
  (E = 64, 3 inits) costs 15 GFLOP per Lloyd iteration and the greedy pass 15 GFLOP per
  alternation step in 7.8k small matrix-vector products, and the R x LN copy is 0.46 GB more.
  Smaller problems (tiny-moe64: 6 x 64 = 384) use the exact vectors;
- fine-tuning swaps (same semantics: `ft_steps` random pairwise swaps between clusters, each
  kept when it raises the score) are proposed in rounds of floor(E / 2) swaps over disjoint
  cluster pairs (a random matching of the clusters). A swap's gain depends only on its two
  clusters (their members, loads and request affinity), so swaps on disjoint pairs commute and
  evaluating a round at once gives what evaluating it one swap after the other would; the
  affinity of every expert to every cluster is kept up to date instead of recomputed, and all
  layers advance together (`expert_place_layers`). Measured at the Qwen3-30B-A3B shape (48
  layers, N = 128, EP 8, 2,560 swaps per layer and step): 12.8 s one swap at a time, 0.6 s.
- the greedy request pass keeps its per-request loop (R = 7.8k requests: under 1 s with the
  projected vectors).
Measured (benchmarks/bench_placement_scale.py, 2 shared cores, load ~2): DeepSeek-V3 shape
59 s (57 s CPU), 5.9 GB peak with the 4.1 GB trace; Qwen3 shape 17 s.

Outputs besides the placement (in `info`): the fit requests' clusters and the token -> device
table T[l, token] with its confidence Tp (the share of the token's expected
activations at layer l that land on that device).

Deviations from the paper, all of them (this stays the faithful baseline; our own solver with
the fixes is `sempar`, placement/sempar/solver.py):
- T / Tp: Alg. 1 labels a token by the clusters of the requests it occurs in; here T[l, token] is
  the per-layer argmax of the token's expected expert share over devices and Tp that share
  (`base.coclustered_placement`), i.e. derived from the expert clusters, not the request ones.
- expert-expert affinity A = Cp^T diag(a) Cp treats a token's expert choices as independent
  across its occurrences; real co-activation counts (pairs chosen together by one occurrence)
  differ (+0.011 held-out LAR when counted for real, tiny-moe64).
- term normalisation (ours, the paper gives none) lets the load term dominate: at the final
  placement on tiny-moe64 the spread of EAF_e / EAF_r over clusters is 0.0016 / 0.0072 while one
  expert's load term is 0.012-0.087, so the greedy pass is close to pure load balancing; gamma =
  0 gives imbalance 2.24 and no setting in between keeps both.
- the objective and the choice of the best step are §3.3's dp objective (per request) also when
  the placement serves tp mode, where locality is per token (dropping the request term alone
  gives 0.364 against 0.355 held-out LAR at EP 4, tp).
- no replicas (`--redundant` refused), nodes ignored (devices relabelled by `base.solve`),
  `--preserve-groups` refused (`base.solve`).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from sempar.affinity.affinity_stats import AffinityStats
from sempar.console import warnings_as_note
from sempar.placement.base import SOLVERS, PlacementProblem, coclustered_placement
from sempar.placement.placement import Placement, RequestClusters

ALPHA, BETA, GAMMA = 1.0, 1.0, 1.0
ALPHA_R, BETA_R = 0.5, 1.0
THETA = 0.5
N_STEPS = 4
EXACT_MAX_DIM = 1024    # ours: request vectors of at most L * N entries are used as they are
PROJ_DIM = 256          # ours: dimension of the random projection above that


def layer_tables(stats: AffinityStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loads float64[L, N], Q float32[L, R, N], A float64[L, N, N]), one layer at a time."""
    L, N, R = stats.L, stats.N, stats.R
    loads = np.empty((L, N))
    Q = np.empty((L, R, N), np.float32)
    A = np.empty((L, N, N))
    for l in range(L):
        loads[l] = stats.expert_load(l)
        Q[l] = stats.request_affinity(l)
        A[l] = stats.expert_affinity(l)
    return loads, Q, A


def request_features(Q: np.ndarray, seed: int) -> tuple[np.ndarray, str]:
    """(float32[R, D] request vectors, how they were made).

    The exact vectors are each request's Q rows over all layers, L2-normalised (D = L N). Above
    `EXACT_MAX_DIM` a seeded Gaussian projection to `PROJ_DIM` dimensions of those unit vectors
    (ours, see the module docstring).
    """
    L, R, N = Q.shape
    norm = np.sqrt(np.einsum("lrn,lrn->r", Q, Q, dtype=np.float64))
    inv = (1.0 / np.maximum(norm, 1e-12)).astype(np.float32)[:, None]
    if L * N <= EXACT_MAX_DIM:
        return Q.transpose(1, 0, 2).reshape(R, L * N) * inv, "exact"
    rng = np.random.default_rng([seed, 0x5E3])
    out = np.zeros((R, PROJ_DIM), np.float32)
    for l in range(L):
        W = rng.standard_normal((N, PROJ_DIM), dtype=np.float32) / np.float32(np.sqrt(PROJ_DIM))
        out += Q[l] @ W
    return out * inv, f"random projection to {PROJ_DIM}"


def expert_place_layers(loads: np.ndarray, A: np.ndarray, Qc: np.ndarray, E: int,
                        rng: np.random.Generator, ft_steps: int) -> np.ndarray:
    """int64[L, N]: cluster of each expert (Alg. 1 lines 3-26), every layer independently.

    loads float[L, N]; A float[L, N, N] (zero diagonal); Qc float[L, E, N] = request-expert
    affinity summed per cluster. The layers advance together (one numpy step serves all L), and
    fine-tuning proposes its `ft_steps` swaps per layer in rounds over disjoint cluster pairs
    (module docstring).
    """
    L, N = loads.shape
    cap = N // E
    li = np.arange(L)
    za = np.maximum(A.sum(axis=(1, 2)), 1e-12)[:, None]
    zr = np.maximum(Qc.sum(axis=(1, 2)), 1e-12)[:, None]
    zl = np.maximum(loads.sum(axis=1), 1e-12)[:, None]
    aff = np.zeros((L, N, E))              # aff[l, e, c] = sum of A[l, e, e'] over e' in c
    cnt = np.zeros((L, E), np.int64)
    load_c = np.zeros((L, E))
    cls = np.empty((L, N), np.int64)
    order = np.argsort(-loads, axis=1, kind="stable")
    for j in range(N):
        e = order[:, j]
        score = ALPHA * aff[li, e] / za + BETA * Qc[li, :, e] / zr - GAMMA * load_c / zl
        score[cnt >= cap] = -np.inf
        c = np.argmax(score, axis=1)
        cls[li, e] = c
        aff[li, :, c] += A[li, :, e]
        cnt[li, c] += 1
        load_c[li, c] += loads[li, e]
    if E < 2 or ft_steps <= 0 or cap * E != N:
        return cls
    slots = np.argsort(cls, axis=1, kind="stable").reshape(L, E, cap)   # experts per cluster
    mean = zl / E
    lc = li[:, None]
    done = 0
    while done < ft_steps:
        m = min(E // 2, ft_steps - done)
        done += m
        perm = np.argsort(rng.random((L, E)), axis=1)
        c1, c2 = perm[:, :m], perm[:, m:2 * m]                          # [L, m]
        i1, i2 = rng.integers(cap, size=(2, L, m))
        e1, e2 = slots[lc, c1, i1], slots[lc, c2, i2]
        d_aff = (aff[lc, e2, c1] - A[lc, e2, e1] + aff[lc, e1, c2] - A[lc, e1, e2]
                 - (aff[lc, e1, c1] + aff[lc, e2, c2]))
        d_req = Qc[lc, c1, e2] + Qc[lc, c2, e1] - Qc[lc, c1, e1] - Qc[lc, c2, e2]
        d = loads[lc, e2] - loads[lc, e1]
        l1, l2 = load_c[lc, c1], load_c[lc, c2]
        d_bal = (np.abs(l1 + d - mean) + np.abs(l2 - d - mean)
                 - np.abs(l1 - mean) - np.abs(l2 - mean))
        ok = ALPHA * d_aff / za + BETA * d_req / zr - GAMMA * d_bal / zl > 0
        if not ok.any():
            continue
        lk = np.broadcast_to(lc, ok.shape)[ok]
        c1, c2, i1, i2, e1, e2, d = c1[ok], c2[ok], i1[ok], i2[ok], e1[ok], e2[ok], d[ok]
        slots[lk, c1, i1], slots[lk, c2, i2] = e2, e1
        cls[lk, e1], cls[lk, e2] = c2, c1
        load_c[lk, c1] += d
        load_c[lk, c2] -= d
        delta = A[lk, :, e2] - A[lk, :, e1]                               # [swaps, N]
        aff[lk, :, c1] += delta
        aff[lk, :, c2] -= delta
    return cls


def local_activations(Q: np.ndarray, ecls: np.ndarray, E: int) -> np.ndarray:
    """float64[R, E]: RAF_e, each request's expected activations on each cluster's experts,
    summed over layers. Q float32[L, R, N], ecls int[L, N]."""
    L, _, N = Q.shape
    onehot = np.zeros((L, N, E), np.float32)
    onehot[np.arange(L)[:, None], np.arange(N)[None, :], ecls] = 1.0
    return np.matmul(Q, onehot).sum(axis=0, dtype=np.float64)


def request_schedule(raf_e: np.ndarray, feats: np.ndarray, lengths: np.ndarray,
                     E: int) -> np.ndarray:
    """int64[R]: cluster of each request (Alg. 1 lines 28-42).

    raf_e float[R, E] from `local_activations`; feats float[R, D] unit request vectors
    (`request_features`): RAF_r of a request to a cluster is its summed dot product with the
    cluster's requests, divided by the largest cluster size.
    """
    R, D = feats.shape
    cap = -(-R // E)
    sums = np.zeros((E, D), feats.dtype)
    cnt = np.zeros(E, np.int64)
    out = np.empty(R, np.int64)
    e_terms = raf_e / np.maximum(raf_e.sum(axis=1, keepdims=True), 1e-12)
    for r in np.argsort(-lengths, kind="stable"):
        raf_r = sums @ feats[r] / max(cnt.max(), 1)
        score = ALPHA_R * raf_r + BETA_R * e_terms[r]
        score[cnt >= cap] = -np.inf
        c = int(np.argmax(score))
        out[r] = c
        sums[c] += feats[r]
        cnt[c] += 1
    return out


def initial_requests(feats: np.ndarray, E: int, seed: int) -> np.ndarray:
    """Alg. 1 line 44: balanced k-means of the requests' expert-affinity vectors feats[R, D]."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    R = feats.shape[0]
    if R < E:
        return np.arange(R) % E
    with warnings_as_note(ConvergenceWarning, "semmoe request k-means"):
        km = KMeans(n_clusters=E, n_init=3, random_state=seed).fit(feats)
    dist = km.transform(feats)                                     # [R, E]
    cap = -(-R // E)
    cnt = np.zeros(E, np.int64)
    out = np.empty(R, np.int64)
    for r in np.argsort(dist.min(axis=1), kind="stable"):
        order = np.argsort(dist[r])
        c = next(int(c) for c in order if cnt[c] < cap)
        out[r] = c
        cnt[c] += 1
    return out


def objective(raf_e: np.ndarray, total: float, rcls: np.ndarray, lengths: np.ndarray,
              E: int, L: int) -> float:
    """Sem-MoE §3.3: theta * token imbalance + (1 - theta) * remote activations (fit data).

    raf_e float[R, E] (`local_activations` of the expert clusters); total = Q.sum()."""
    local = raf_e[np.arange(rcls.size), rcls].sum()
    remote = total - local
    tokens = np.bincount(rcls, weights=lengths, minlength=E)
    imbalance = np.abs(tokens - lengths.sum() / E).sum() * L      # per layer, like the activations
    return THETA * imbalance + (1 - THETA) * remote


@SOLVERS.register("semmoe", replicas=False, preserves_groups=False, mode_aware=False,
                  needs_token_ids=True)   # co-clusters tokens by id (base.py)
def semmoe(p: PlacementProblem) -> Placement:
    """Co-cluster experts and requests (one device per cluster); no replicas, nodes ignored."""
    meta = p.trace.meta
    L, N, E = meta.num_layers, meta.num_experts, p.num_devices
    rng = np.random.default_rng(p.seed)
    stats = AffinityStats(p.trace)
    R, lengths = stats.R, stats.lengths
    loads, Q, A = layer_tables(stats)
    total = float(Q.sum(dtype=np.float64))
    feats, how = request_features(Q, p.seed)
    rcls = initial_requests(feats, E, p.seed)
    best = None
    for step in range(N_STEPS):
        onehot_r = sparse.csr_matrix((np.ones(R, np.float32), (rcls, np.arange(R))), shape=(E, R))
        Qc = np.stack([onehot_r @ Q[l] for l in range(L)]).astype(np.float64)     # [L, E, N]
        ecls = expert_place_layers(loads, A, Qc, E, rng, 20 * N)
        raf_e = local_activations(Q, ecls, E)
        rcls = request_schedule(raf_e, feats, lengths, E)
        score = objective(raf_e, total, rcls, lengths, E, L)
        if best is None or score < best[0]:
            best = (score, ecls.copy(), rcls.copy(), step)
    del Q, A, feats
    score, ecls, rcls, step = best
    return coclustered_placement(p, "semmoe", ecls, stats, info={
        "objective": float(score), "best_step": int(step), "request_features": how},
        request_cluster=RequestClusters(stats.reqs, rcls))
