"""`smoe-cem`: s-MoE's cross-entropy co-clustering of tokens and experts (speculative-moe.txt).

Source: s-MoE (the papers folder's speculative-moe.txt), Appendix B ("Algorithm for the s-TS/s-EG
Solver", line 291; its description of Algorithm 1 at line 295) and Algorithm 1 "CEO-based
co-clustering algorithm" (line 303 onwards). The main text (line 118) calls it a "two-phase
cross-entropy optimization algorithm"; §5 (line 189) compares it against METIS and 2D balanced
k-means.

Per MoE layer l, with E = G co-clusters (one per device), N experts, U fit tokens, the
token -> expert confidence table Cp[l] (U x N, rows sum to 1) and the token frequency a (U),
both from `affinity.affinity_stats.AffinityStats`:

- Alg. 1 lines 1-2: p_matrix_ep = ones(N, E) / E, p_matrix_tk = ones(U, E) / E.
- `sample` (lines 3-23): each sample visits the rows and draws a label from
  multinomial(1, E, norm(p[i] * mask)) (line 11). Experts: a cluster is masked once it holds
  N/E experts (lines 12-15). Tokens: cnter[cls] += sum(Cp[i] * a[i]) (= a[i]) and the cluster is
  masked once cnter[cls] >= sum(Cp * a) / E * beta (lines 16-19), so a cluster overshoots the
  token capacity by less than one token's frequency.
- lines 25-30: K expert samples and K token samples per step; sample s of each forms pair s.
  Score (line 27, "local activation frequency", "summation of T of the same co-clusters"):
      score = sum_j a_j * sum_{k : cluster(k) = cluster(j)} Cp[j, k]
  i.e. the expected fit activations that stay on the token's own device. The top rho * 100 %
  pairs are the elites (line 28) and both probability matrices are updated from them (line 29).
- beta = 1.1, rho = 0.2 as the paper sets them (line 295, "In practice ...").

Choices where the paper is vague or where we deviate (ours):
- Sampling is vectorised (`cem_sampling.sample_batch`, the same distribution as line 11).
- Visiting order: as written, rows 0..len-1 (line 9; token rows are sorted by token id, expert
  rows by expert id), the same in every sample. `order="random"` draws a fresh permutation per
  step, `order="frequency"` visits tokens by decreasing frequency and experts by decreasing load
  (both ours). Measured on tiny-moe64 (EP 4, held-out tp LAR): index 0.320, random 0.314,
  frequency 0.326.
- Update (line 29, unspecified): the usual smoothed cross-entropy update
      p <- smoothing * (label frequency among the elites) + (1 - smoothing) * p,
  smoothing = 0.7 by default, so no probability collapses to exactly 0 in one step.
- Output (lines 32-33 take argmax of the probability matrices, which can break the N/E
  experts-per-cluster balance): we return the best-scoring pair sampled over all steps, which
  is feasible by construction. Its token labels form the token table T; the confidence Tp is the
  share of the token's expected activations at that layer that land on its cluster (the paper
  uses the probability value; ours matches `semmoe` and orders tokens in `home_tp_table`).
- Defaults n_iter = 40 steps, n_samples = K = 64 per step (the paper gives none).
- Load balance: Alg. 1 balances only expert counts (N/E) and token frequency (beta), not the
  experts' activation load, so hot experts may share a device (max/mean device load ~1.4-1.6 on
  tiny-moe64). §5 (line 189) mentions "an additional regularizer [for] load balancing" without
  a formula; `balance` > 0 (ours, default 0 = as written) subtracts
  balance * (max / mean expected expert load per cluster - 1) from each sample's score
  (tiny-moe64: balance = 0.1 gives imbalance 1.05 at LAR 0.310).
- Known limitation of CE: a token's probability can collapse onto a poor cluster before the
  elites correct it (two planted co-clusters: 1-2 of 100 tokens per layer end on the wrong side
  at the defaults; n_samples = 128 removes it there).

Scaling (ours; targets: DeepSeek-V3's shape, 58 layers x 256 experts, EP 64 as 8
nodes x 8, 2M fit tokens of which 128k distinct, in <= 120 s and 8 GB; Qwen3-30B-A3B's, 48 x
128, EP 8, 1M tokens, in <= 30 s). The sampler costs K x rows x E per round and step, so:
- all layers run as one batch of independent problems (`cem_batch`; chunks of at most
  `BATCH_CELLS` cells), one numpy step serving every layer, BLAS on one thread (many small
  GEMMs; a second thread only contends on 2 shared cores);
- above `MAX_TOKENS` (8192) distinct fit tokens, CE runs on the `TOP_TOKENS` (256) most frequent
  ones and every other token goes to the device holding most of its expected activations once
  the experts are placed (`coclustered_placement`). The synthetic traces' heads are heavy: the
  top 256 tokens hold 50% of the occurrences of both the Qwen3-shaped 1M-token trace (512: 56%,
  4096: 61%) and the DeepSeek-V3-shaped 2M-token one (1024: 57%). Held-out tp LAR barely moved
  with M on a 6-layer DeepSeek-V3-shaped trace (200k fit tokens, EP 64 / 8 nodes: M = 256 0.045,
  512 0.045, 1024 0.047, against vanilla 0.016 and semmoe 0.054) while the time grew about
  linearly with M; the tiny dev traces (5.6k distinct fit tokens) are clustered whole;
- with nodes (1 < nodes < G) and G > `FLAT_MAX_DEVICES` (16), `hierarchy="auto"` clusters in
  two stages (`staged_problems`, ExFlow's node-then-GPU staging): first nodes as co-clusters,
  then the devices inside each node over that node's experts and tokens. The rounds of the
  sampler grow with E, so two problems with E = 8 cost far less than one with E = 64, and the
  first stage maximises node-local activations, which the inter-node links care about most.
  The placement is then marked `node_aware` (no node relabelling afterwards).
  Measured (benchmarks/bench_placement_scale.py, 2 shared cores, load ~2): DeepSeek-V3 shape
  76 s (65 s CPU), 4.8 GB peak with the 4.1 GB trace; Qwen3 shape 16 s.

`info["cem"]` holds, per layer, the best score of each step's fresh samples (`iter_best`), the
best score so far (`best`, non-decreasing) and the elites' mean (`elite_mean`); all as a fraction
of the layer's fit activations (a local activation rate on the fit tokens), minus the optional
balance penalty.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from threadpoolctl import threadpool_limits

from sempar.errors import InputError
from sempar.affinity.affinity_stats import AffinityStats
from sempar.placement.base import SOLVERS, PlacementProblem, coclustered_placement
from sempar.placement.cem_sampling import sample_batch
from sempar.placement.placement import Placement

BETA = 1.1          # token load-balance factor (paper, line 295)
RHO = 0.2           # elite fraction (paper, line 295)
N_ITER = 40         # ours
N_SAMPLES = 64      # ours
SMOOTHING = 0.7     # ours
BALANCE = 0.0       # ours, off: weight of the expert-load imbalance penalty in the score
ORDER = "index"     # visiting order of the rows in `sample`: index (line 9), random, frequency
MAX_TOKENS = 8192   # ours: above this many distinct fit tokens, cluster only the TOP_TOKENS
TOP_TOKENS = 256    # ours: most frequent ones (module docstring)
HIERARCHY = "auto"  # ours: flat, nodes, or auto (nodes when G > FLAT_MAX_DEVICES and nodes > 1)
FLAT_MAX_DEVICES = 16
BATCH_CELLS = 1 << 24   # ours: (problem, sample, row, cluster) cells handled in one batch


def local_scores(M: np.ndarray, ep: np.ndarray, tk: np.ndarray, E: int) -> np.ndarray:
    """float64[P, K]: per problem and sample, sum_j sum_{k: ep[s, k] = tk[s, j]} M[j, k] (line 27).

    M float32[P, n, N] expected activations; ep int[P, K, N], tk int[P, K, n] labels. For
    E <= 16 one dense GEMM M @ onehot(ep) per problem (E times the work of the sparse product,
    but BLAS), else the sparse product onehot(tk) @ M (ours; same sums up to float rounding).
    """
    P, n, N = M.shape
    K = ep.shape[1]
    out = np.empty((P, K))
    if E <= 16:
        H = np.zeros((P, N, K * E), np.float32)
        col = np.arange(K)[None, :, None] * E + ep                          # [P, K, N]
        H[np.arange(P)[:, None, None], np.arange(N)[None, None, :], col] = 1.0
        MH = np.matmul(M, H)                                                # [P, n, K * E]
        idx = (np.arange(K)[None, :, None] * E + tk).transpose(0, 2, 1)      # [P, n, K]
        return np.take_along_axis(MH, idx, axis=2).sum(axis=1, dtype=np.float64)
    for q in range(P):
        rows = (np.arange(K)[:, None] * E + tk[q]).ravel()
        S = sparse.csr_matrix((np.ones(rows.size, np.float32), (rows, np.tile(np.arange(n), K))),
                              shape=(K * E, n))
        Y = (S @ M[q]).reshape(K, E, N)             # expected activations per token cluster
        out[q] = Y[np.arange(K)[:, None], ep[q], np.arange(N)[None, :]].sum(axis=1,
                                                                          dtype=np.float64)
    return out


def _freq(labels: np.ndarray, E: int) -> np.ndarray:
    """float[P, n, E]: how often each row takes each label over axis 1 of labels int[P, S, n]."""
    P, S, n = labels.shape
    key = (np.arange(P)[:, None, None] * n + np.arange(n)[None, None, :]) * E + labels
    return np.bincount(key.ravel(), minlength=P * n * E).reshape(P, n, E) / S


def cem_batch(Cp: np.ndarray, a: np.ndarray, E: int, rng: np.random.Generator,
              n_iter: int = N_ITER, n_samples: int = N_SAMPLES, beta: float = BETA,
              rho: float = RHO, smoothing: float = SMOOTHING, order: str = ORDER,
              balance: float = BALANCE, token_weight: np.ndarray | None = None):
    """Alg. 1 for P independent problems at once (layers, or nodes of layers).

    Cp float[P, U, N] token -> expert confidence, a float[P, U] token frequency; token_weight
    float[P, U] what a token adds to its cluster's counter (default sum(Cp[i] * a[i]), line 17).
    Returns (expert clusters int64[P, N], token clusters int64[P, U], one history dict per
    problem).
    """
    P, U, N = Cp.shape
    K = n_samples
    M = np.asarray(Cp, np.float32) * np.asarray(a, np.float32)[:, :, None]   # [P, U, N]
    total = np.maximum(M.sum(axis=(1, 2), dtype=np.float64), 1e-12)
    eload = M.sum(axis=1, dtype=np.float64)                                # [P, N]
    w_tok = (M.sum(axis=2, dtype=np.float64) if token_weight is None
             else np.asarray(token_weight, np.float64))                    # line 17
    tok_cap = w_tok.sum(axis=1) / E * beta                                 # line 18
    ep_cap = np.full(P, N // E, np.float64)
    p_ep = np.full((P, N, E), 1.0 / E)                                     # line 1
    p_tk = np.full((P, U, E), 1.0 / E)                                     # line 2
    n_elite = max(1, int(np.ceil(rho * K)))
    if order == "index":
        ep_order = np.broadcast_to(np.arange(N), (P, N))
        tk_order = np.broadcast_to(np.arange(U), (P, U))
    elif order == "frequency":
        ep_order = np.argsort(-eload, axis=1, kind="stable")
        tk_order = np.argsort(-w_tok, axis=1, kind="stable")
    elif order != "random":
        raise InputError(f"smoe-cem: order {order!r} is not index, random or frequency")
    best = np.full(P, -np.inf)
    best_ep = np.zeros((P, N), np.int64)
    best_tk = np.zeros((P, U), np.int64)
    hist = np.empty((3, n_iter, P))
    pr = np.arange(P)
    for it in range(n_iter):
        if order == "random":
            ep_order = np.argsort(rng.random((P, N)), axis=1)
            tk_order = np.argsort(rng.random((P, U)), axis=1)
        ep = sample_batch(p_ep, np.ones((P, N)), ep_cap, K, rng, ep_order)        # line 25
        tk = sample_batch(p_tk, w_tok, tok_cap, K, rng, tk_order)                 # line 26
        scores = local_scores(M, ep, tk, E) / total[:, None]                      # line 27
        if balance:                               # optional §5 load regularizer (ours)
            key = (pr[:, None, None] * K + np.arange(K)[None, :, None]) * E + ep
            cl = np.bincount(key.ravel(), weights=np.broadcast_to(eload[:, None, :], ep.shape)
                             .ravel(), minlength=P * K * E).reshape(P, K, E)
            scores = scores - balance * (cl.max(axis=2) / np.maximum(cl.mean(axis=2), 1e-12)
                                         - 1.0)
        elite = np.argsort(-scores, axis=1, kind="stable")[:, :n_elite]         # line 28
        i0 = elite[:, 0]
        top = scores[pr, i0]
        better = top > best
        best = np.where(better, top, best)
        best_ep[better] = ep[pr, i0][better]
        best_tk[better] = tk[pr, i0][better]
        f_ep = _freq(ep[pr[:, None], elite], E)                                  # line 29
        f_tk = _freq(tk[pr[:, None], elite], E)
        p_ep = smoothing * f_ep + (1 - smoothing) * p_ep
        p_tk = smoothing * f_tk + (1 - smoothing) * p_tk
        hist[0, it], hist[1, it] = top, best
        hist[2, it] = np.take_along_axis(scores, elite, axis=1).mean(axis=1)
    hists = [{"iter_best": hist[0, :, q].tolist(), "best": hist[1, :, q].tolist(),
              "elite_mean": hist[2, :, q].tolist()} for q in range(P)]
    return best_ep, best_tk, hists


def cem_problems(Cp: np.ndarray, a: np.ndarray, E: int, rng: np.random.Generator,
                 sizes: np.ndarray | None = None, **kw):
    """`cem_batch` over P problems in chunks of at most `BATCH_CELLS` sampler cells
    (P x K x U x E), so that memory stays bounded; same outputs.

    sizes int[P]: the real token rows of each problem (the rest, at the end, is padding:
    weight 0, activations 0). Problems are then taken by increasing size and each chunk is cut
    to its own largest size (a new chunk starts when the size grows by more than a third), so
    that little time goes to padding rows; their labels come back as 0.
    """
    P, U, N = Cp.shape
    K = kw.get("n_samples", N_SAMPLES)
    tw = kw.pop("token_weight", None)
    if sizes is None:
        sizes = np.full(P, U)
    sizes = np.maximum(np.asarray(sizes, np.int64), 1)
    order = np.argsort(sizes, kind="stable")
    chunks, cur = [], []
    for q in order:
        n_c = max(sizes[q], sizes[cur[-1]] if cur else 1)
        if cur and ((len(cur) + 1) * K * max(n_c, N) * E > BATCH_CELLS
                    or sizes[q] > 4 * sizes[cur[0]] / 3):
            chunks.append(cur)
            cur = []
        cur.append(int(q))
    chunks.append(cur)
    eps = np.empty((P, N), np.int64)
    tks = np.zeros((P, U), np.int64)
    hists: list = [None] * P
    for c in chunks:
        idx = np.asarray(c)
        n_c = int(sizes[idx].max())
        e, t, h = cem_batch(Cp[idx, :n_c], a[idx, :n_c], E, rng,
                            token_weight=None if tw is None else tw[idx, :n_c], **kw)
        eps[idx], tks[idx, :n_c] = e, t
        for q, hq in zip(c, h):
            hists[q] = hq
    return eps, tks, hists


def staged_problems(Cp: np.ndarray, a: np.ndarray, E: int, nodes: int,
                    rng: np.random.Generator, **kw):
    """(expert devices int64[L, N], token devices int64[L, U], histories) in two stages (ours,
    ExFlow's node-then-GPU staging): Alg. 1 with one co-cluster per node for every layer, then
    Alg. 1 inside every (layer, node) over that node's experts and tokens with one co-cluster
    per device. Devices of node n are n * E / nodes ... (n + 1) * E / nodes - 1 (contiguous
    nodes). Inside a node a token adds its frequency a to its device's counter (stage 1 adds
    sum(Cp[i] * a[i]) = a too), so beta balances tokens as in the flat problem; nodes' token
    lists are padded with weight-0, activation-0 rows (inert). The history is stage 1's, plus
    `device_stage_best`: stage 2's best score per node.

    Cp float[L, U, N], a float[L, U].
    """
    L, U, N = Cp.shape
    per = E // nodes
    node_e, node_t, hists = cem_problems(Cp, a, nodes, rng, **kw)
    xe = np.argsort(node_e, axis=1, kind="stable").reshape(L, nodes, N // nodes)  # experts
    counts = np.stack([np.bincount(t, minlength=nodes) for t in node_t])          # [L, nodes]
    n2 = max(1, int(counts.max()))
    xt = np.zeros((L, nodes, n2), np.int64)
    valid = np.arange(n2)[None, None, :] < counts[:, :, None]
    tok_sorted = np.argsort(node_t, axis=1, kind="stable")        # token rows grouped by node
    offs = np.concatenate([np.zeros((L, 1), np.int64), np.cumsum(counts, axis=1)[:, :-1]], 1)
    src = np.minimum(offs[:, :, None] + np.arange(n2)[None, None, :], U - 1)
    xt[:] = np.take_along_axis(tok_sorted[:, None, :], src.reshape(L, 1, -1), axis=2
                               ).reshape(L, nodes, n2)
    li = np.arange(L)[:, None, None, None]
    Cp2 = Cp[li, xt[:, :, :, None], xe[:, :, None, :]] * valid[..., None]  # [L, nodes, n2, N/nodes]
    a2 = np.take_along_axis(a, xt.reshape(L, -1), axis=1).reshape(L, nodes, n2) * valid
    P2 = L * nodes
    e2, t2, h2 = cem_problems(Cp2.reshape(P2, n2, N // nodes), a2.reshape(P2, n2), per, rng,
                              sizes=counts.reshape(P2), token_weight=a2.reshape(P2, n2), **kw)
    dev_e = np.empty((L, N), np.int64)
    dev_t = np.empty((L, U), np.int64)
    node_of = np.arange(nodes)[None, :, None]
    np.put_along_axis(dev_e, xe.reshape(L, -1), (node_of * per + e2.reshape(L, nodes, -1))
                      .reshape(L, -1), axis=1)
    dev2 = (node_of * per + t2.reshape(L, nodes, n2))
    for l in range(L):
        dev_t[l, xt[l][valid[l]]] = dev2[l][valid[l]]
    for l in range(L):
        hists[l]["device_stage_best"] = [h2[l * nodes + n]["best"][-1] for n in range(nodes)]
    return dev_e, dev_t, hists


@SOLVERS.register("smoe-cem", replicas=False, preserves_groups=False, mode_aware=False,
                  needs_token_ids=True)   # co-clusters tokens by id (base.py)
def smoe_cem(p: PlacementProblem, n_iter: int = N_ITER, n_samples: int = N_SAMPLES,
             beta: float = BETA, rho: float = RHO, smoothing: float = SMOOTHING,
             order: str = ORDER, balance: float = BALANCE, max_tokens: int | None = MAX_TOKENS,
             hierarchy: str = HIERARCHY) -> Placement:
    """s-MoE CEO co-clustering per layer (one device per co-cluster); no replicas.

    max_tokens: above this many distinct fit tokens the CE method runs on the `TOP_TOKENS`
    most frequent ones and the rest go where most of their expected activations land (None:
    always all tokens). hierarchy: "flat" (Alg. 1 as written), "nodes" (`staged_problems`) or
    "auto" (nodes when the problem has 1 < nodes < G and G > `FLAT_MAX_DEVICES`).
    """
    if n_iter < 1 or n_samples < 1 or not 0.0 < rho <= 1.0 or beta < 1.0:
        raise InputError(f"smoe-cem: n_iter={n_iter}, n_samples={n_samples}, rho={rho}, "
                         f"beta={beta} (need n_iter, n_samples >= 1, 0 < rho <= 1, beta >= 1)")
    if hierarchy not in ("auto", "flat", "nodes"):
        raise InputError(f"smoe-cem: hierarchy {hierarchy!r} is not auto, flat or nodes")
    if order not in ("index", "random", "frequency"):
        raise InputError(f"smoe-cem: order {order!r} is not index, random or frequency")
    meta = p.trace.meta
    L, E, nodes = meta.num_layers, p.num_devices, p.num_nodes
    staged = 1 < nodes < E and (hierarchy == "nodes"
                                or (hierarchy == "auto" and E > FLAT_MAX_DEVICES))
    stats = AffinityStats(p.trace)
    U = stats.U
    if max_tokens is None or U <= max_tokens:
        rows = np.arange(U)
    else:                                   # the most frequent tokens, kept in token-id order
        rows = np.sort(np.argsort(-stats.a, kind="stable")[:TOP_TOKENS])
    a = np.broadcast_to(stats.a[rows], (L, rows.size))
    Cp = np.stack([stats.cp_rows(l, rows) for l in range(L)])                # [L, n, N]
    kw = {"n_iter": n_iter, "n_samples": n_samples, "beta": beta, "rho": rho,
          "smoothing": smoothing, "order": order, "balance": balance}
    rng = np.random.default_rng(p.seed)
    with threadpool_limits(1):             # many small GEMMs: threads only add overhead
        if staged:
            ecls, t, hists = staged_problems(Cp, a, E, nodes, rng, **kw)
        else:
            ecls, t, hists = cem_problems(Cp, a, E, rng, **kw)
    del Cp
    tcls = np.full((L, U), -1, np.int32)     # -1: not clustered, goes to its argmax device
    tcls[:, rows] = t
    return coclustered_placement(p, "smoe-cem", ecls, stats, tcls, info={
        "node_aware": staged,            # staged: devices already grouped by node
        "cem": {"n_iter": n_iter, "n_samples": n_samples, "beta": beta, "rho": rho,
                "smoothing": smoothing, "hierarchy": "nodes" if staged else "flat",
                "clustered_tokens": int(rows.size),
                "token_coverage": float(stats.a[rows].sum() / stats.a.sum()),
                "best_score": [h["best"][-1] for h in hists], "layers": hists}})

