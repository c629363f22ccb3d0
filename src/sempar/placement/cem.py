"""`smoe-cem`: s-MoE's cross-entropy co-clustering of tokens and experts (speculative-moe.txt).

Source: /work/shared/papers/speculative-moe.txt, Appendix B ("Algorithm for the s-TS/s-EG
Solver", line 291; its description of Algorithm 1 at line 295) and Algorithm 1 "CEO-based co-clustering algorithm" (line 303 onwards). The
main text (line 118) calls it a "two-phase cross-entropy optimization algorithm"; §5 (line 189)
compares it against METIS and 2D balanced k-means.

Per MoE layer l, with E = G co-clusters (one per device), N experts, U fit tokens, the
token -> expert confidence table Cp[l] (U x N, rows sum to 1) and the token frequency a (U),
both from `semmoe.affinity_tables`:

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
- Sampling is vectorised (same distribution as line 11): each (sample, row) gets one uniform u
  and its label is the inverse-CDF draw from norm(p[i] * mask); the same u stays valid when a
  mask changes because it is independent of the rows before. All K samples advance together in
  at most E rounds: a round labels the unsettled rows under the current masks, finds per sample
  the first row whose label fills a cluster (cumulative sums), settles the rows up to it and
  masks that cluster (lines 14-15 / 18-19).
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
- Defaults n_iter = 40 steps, n_samples = K = 64 per step (the paper gives none); about 1-2 s
  per layer on the tiny-moe64 fit split (U ~ 5.6k, N = 64, E = 4) on a shared 2-core machine.
- Load balance: Alg. 1 balances only expert counts (N/E) and token frequency (beta), not the
  experts' activation load, so hot experts may share a device (max/mean device load ~1.4-1.6 on
  tiny-moe64). §5 (line 189) mentions "an additional regularizer [for] load balancing" without
  a formula; `balance` > 0 (ours, default 0 = as written) subtracts
  balance * (max / mean expected expert load per cluster - 1) from each sample's score
  (tiny-moe64: balance = 0.1 gives imbalance 1.05 at LAR 0.310).
- Known limitation of CE: a token's probability can collapse onto a poor cluster before the
  elites correct it (two planted co-clusters: 1-2 of 100 tokens per layer end on the wrong side
  at the defaults; n_samples = 128 removes it there).

`info["cem"]` holds, per layer, the best score of each step's fresh samples (`iter_best`), the
best score so far (`best`, non-decreasing) and the elites' mean (`elite_mean`); all as a fraction
of the layer's fit activations (a local activation rate on the fit tokens), minus the optional
balance penalty.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from sempar.errors import InputError
from sempar.placement.base import SOLVERS, PlacementProblem, coclustered_placement
from sempar.placement.placement import Placement
from sempar.placement.semmoe import affinity_tables

BETA = 1.1          # token load-balance factor (paper, line 295)
RHO = 0.2           # elite fraction (paper, line 295)
N_ITER = 40         # ours
N_SAMPLES = 64      # ours
SMOOTHING = 0.7     # ours
BALANCE = 0.0       # ours, off: weight of the expert-load imbalance penalty in the score
ORDER = "index"     # visiting order of the rows in `sample`: index (line 9), random, frequency


def sample_labels(p: np.ndarray, weights: np.ndarray, cap: float, n_samples: int,
                  rng: np.random.Generator, order: np.ndarray | None = None) -> np.ndarray:
    """int64[K, n]: Alg. 1 `sample` (lines 3-23) for a probability matrix p float[n, E].

    Row i adds weights[i] to its cluster's counter; a cluster is masked for the rows visited
    after its counter reaches `cap` (experts: weights 1, cap N/E; tokens: weights a, cap
    beta * sum(a) / E).

    Vectorised: every (sample, row) gets one uniform u; its label is the inverse-CDF draw from
    norm(p[i] * mask) (line 11). All K samples advance together in rounds: a round labels every
    unsettled row with the current masks, finds in each sample the first row whose label fills a
    cluster, settles the rows up to it and masks that cluster; at most E rounds.
    """
    n, E = p.shape
    K = n_samples
    if order is None:                                              # visiting order (line 9)
        order = rng.permutation(n)
    pe = np.ascontiguousarray(np.maximum(p[order], 1e-12).T, dtype=np.float32)   # [E, n]
    w = weights[order].astype(np.float32)
    u = rng.random((K, n), dtype=np.float32)
    lab = np.zeros((K, n), np.int8)
    closed = np.zeros((E, K), bool)
    load = np.zeros((E, K))
    start = np.zeros(K, np.int64)
    todo = np.ones(K, bool)
    while todo.any():
        lo = int(start[todo].min())                             # rows before lo are all settled
        pos = np.arange(lo, n)[None, :]
        if not closed.any():                                    # no mask yet: shared CDF
            cdf = np.cumsum(pe[:, lo:], axis=0)
            target = u[:, lo:] * cdf[-1]
            c = np.zeros(target.shape, np.int8)
            for e in range(E - 1):
                c += target >= cdf[e]
        else:
            opened = (~closed).astype(np.float32)[:, :, None]  # [E, K, 1]
            pm = pe[:, None, lo:] * opened                       # [E, K, n - lo]
            cdf = np.cumsum(pm, axis=0)
            target = u[:, lo:] * cdf[-1]
            c = np.zeros(target.shape, np.int8)
            for e in range(E - 1):
                c += target >= cdf[e]
        active = (pos >= start[:, None]) & todo[:, None]
        hit = np.full(K, n)                                     # first row that fills a cluster
        for e in range(E):
            if not (~closed[e] & todo).any():
                continue
            cs = np.cumsum(w[lo:] * (active & (c == e)), axis=1)
            full = cs >= (cap - load[e])[:, None]
            h = np.where(full[:, -1] & ~closed[e], full.argmax(axis=1) + lo, n)
            hit = np.minimum(hit, h)
        take = active & (pos <= hit[:, None])
        lab[:, lo:] = np.where(take, c, lab[:, lo:])
        for e in range(E):
            load[e] += (w[lo:] * (take & (c == e))).sum(axis=1)
        filled = todo & (hit < n)
        rows = np.flatnonzero(filled)
        closed[c[rows, hit[rows] - lo], rows] = True
        start = np.where(filled, hit + 1, n)
        todo = start < n
    out = np.empty((K, n), np.int64)
    out[:, order] = lab
    return out


def cem_layer(Cp: np.ndarray, a: np.ndarray, E: int, rng: np.random.Generator,
              n_iter: int = N_ITER, n_samples: int = N_SAMPLES, beta: float = BETA,
              rho: float = RHO, smoothing: float = SMOOTHING, order: str = ORDER,
              balance: float = BALANCE):
    """Alg. 1 for one layer: (expert clusters int64[N], token clusters int64[U], history dict).

    Cp float[U, N] token -> expert confidence, a float[U] token frequency.
    """
    U, N = Cp.shape
    M = Cp.astype(np.float64) * a[:, None]                    # expected activations [U, N]
    total = max(M.sum(), 1e-12)
    M32 = M.astype(np.float32)
    eload = M.sum(axis=0)                                      # expected load per expert
    cols = np.tile(np.arange(U), n_samples)
    w_tok = M.sum(axis=1)                                      # sum(Cp[i] * a[i]) (line 17)
    tok_cap = w_tok.sum() / E * beta                           # line 18
    p_ep = np.full((N, E), 1.0 / E)                            # line 1
    p_tk = np.full((U, E), 1.0 / E)                            # line 2
    n_elite = max(1, int(np.ceil(rho * n_samples)))
    if order == "index":
        ep_order, tk_order = np.arange(N), np.arange(U)
    elif order == "frequency":
        ep_order = np.argsort(-M.sum(axis=0), kind="stable")
        tk_order = np.argsort(-w_tok, kind="stable")
    elif order == "random":
        ep_order = tk_order = None
    else:
        raise InputError(f"smoe-cem: order {order!r} is not index, random or frequency")
    best = (-np.inf, None, None)
    hist = {"iter_best": [], "best": [], "elite_mean": []}
    for _ in range(n_iter):
        ep = sample_labels(p_ep, np.ones(N), N // E, n_samples, rng, ep_order)       # line 25
        tk = sample_labels(p_tk, w_tok, tok_cap, n_samples, rng, tk_order)           # line 26
        rows = (np.arange(n_samples)[:, None] * E + tk).ravel()           # line 27
        S = sparse.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)),
                              shape=(n_samples * E, U))
        Y = (S @ M32).reshape(n_samples, E, N)     # expected activations per token cluster
        scores = Y[np.arange(n_samples)[:, None], ep, np.arange(N)[None, :]].sum(axis=1)
        scores = scores.astype(np.float64) / total
        if balance:                               # optional §5 load regularizer (ours)
            cl = np.stack([np.bincount(r, weights=eload, minlength=E) for r in ep])
            scores = scores - balance * (cl.max(axis=1) / max(cl.mean(), 1e-12) - 1.0)
        elite = np.argsort(-scores, kind="stable")[:n_elite]                        # line 28
        i0 = int(elite[0])
        if scores[i0] > best[0]:
            best = (float(scores[i0]), ep[i0].copy(), tk[i0].copy())
        f_ep = np.bincount((np.arange(N) * E + ep[elite]).ravel(),                 # line 29
                           minlength=N * E).reshape(N, E)
        f_tk = np.bincount((np.arange(U) * E + tk[elite]).ravel(),
                           minlength=U * E).reshape(U, E)
        p_ep = smoothing * f_ep / n_elite + (1 - smoothing) * p_ep
        p_tk = smoothing * f_tk / n_elite + (1 - smoothing) * p_tk
        hist["iter_best"].append(float(scores[i0]))
        hist["best"].append(best[0])
        hist["elite_mean"].append(float(scores[elite].mean()))
    return best[1], best[2], hist


@SOLVERS.register("smoe-cem")
def smoe_cem(p: PlacementProblem, n_iter: int = N_ITER, n_samples: int = N_SAMPLES,
             beta: float = BETA, rho: float = RHO, smoothing: float = SMOOTHING,
             order: str = ORDER, balance: float = BALANCE) -> Placement:
    """s-MoE CEO co-clustering per layer (one device per co-cluster); no replicas, nodes ignored."""
    if p.redundant:
        raise InputError("smoe-cem: places every expert once; --redundant is not supported")
    if n_iter < 1 or n_samples < 1 or not 0.0 < rho <= 1.0 or beta < 1.0:
        raise InputError(f"smoe-cem: n_iter={n_iter}, n_samples={n_samples}, rho={rho}, "
                         f"beta={beta} (need n_iter, n_samples >= 1, 0 < rho <= 1, beta >= 1)")
    meta = p.trace.meta
    L, N, E = meta.num_layers, meta.num_experts, p.num_devices
    tokens, Cp, a = affinity_tables(p)[:3]
    seeds = np.random.SeedSequence(p.seed).spawn(L)
    ecls = np.empty((L, N), np.int64)
    tcls = np.empty((L, tokens.size), np.int64)
    hists = []
    for l in range(L):
        rng = np.random.default_rng(seeds[l])
        e, t, h = cem_layer(Cp[l], a, E, rng, n_iter, n_samples, beta, rho, smoothing,
                            order, balance)
        ecls[l], tcls[l] = e, t
        hists.append(h)
    return coclustered_placement(p, "smoe-cem", ecls, tokens, Cp, tcls, info={
        "cem": {"n_iter": n_iter, "n_samples": n_samples, "beta": beta, "rho": rho,
                "smoothing": smoothing, "best_score": [h["best"][-1] for h in hists],
                "layers": hists}})
