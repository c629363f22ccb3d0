"""The two co-clustering baselines of Speculative MoE (s-MoE) §5.7: `metis` and `kmeans2d`.

s-MoE §5.7 (Algorithm Evaluation) compares its CEO solver with "METIS (Karypis & Kumar, 1997)
and 2D Balanced KMeans, using the same predicted routing likelihood as affinity. METIS models the
token-expert routing matrix as an undirected graph and solves the minimum k-cut solution. 2D
Balanced KMeans performs a two-stage balanced KMeans clustering for tokens and experts with the
predicted routing affinity separately." That is all the paper says; the rest below is our choice.

Both work per MoE layer on the fit trace's statistics from
`affinity.affinity_stats.AffinityStats`: token frequency a[u] and token -> expert confidence
Cp[l, u, e] (so the co-activation count of token u and expert e is c[u, e] = a[u] * k *
Cp[l, u, e], an integer). One cluster = one device; every
expert is placed once (no replicas), N/G experts per device. Both return, besides the placement,
its `token_table` (token -> device per layer, with confidence = the share of the token's
expected activations at that layer that land on that device), which tp/dp evaluation uses to
place tokens.

`metis` (choices ours):
- graph: the bipartite token-expert graph of layer l. Vertices: the U fit tokens (weight a[u])
  and the N experts (weight = load, sum_u c[u, e]); edge token u - expert e with integer weight
  c[u, e] when c[u, e] > 0. Single balance constraint on that combined weight (METIS default
  imbalance 3%), partitioned with pymetis `part_graph` into G parts (recursive bisection for
  G <= 8, k-way above, pymetis' default), METIS seed = problem seed.
- count fix-up: METIS balances vertex weight, not the count of expert vertices per part. While a
  part holds more than N/G experts we move one expert from an over-full part to an under-full
  one, picking the (expert, target) pair that loses the least affinity, affinity of expert e to
  part p = sum of c[u, e] over tokens u in p (so the lowest-affinity experts move first).
- token table: a token goes to its METIS part (that is the co-cluster METIS found); its
  confidence is the share of its activations on the experts that part holds after the fix-up.
- an isolated expert (never activated in the fit trace) is a weight-0 vertex; METIS puts it
  anywhere and the fix-up moves it first (affinity 0).

`kmeans2d` (choices ours):
- stage 1, experts: feature of expert e = the distribution of its activations over fit tokens,
  c[:, e] / load[e] (zero when never activated), L2-normalised. sklearn KMeans (k-means++,
  n_init=1, random_state=seed) seeds G centroids; then balanced Lloyd iterations: the exactly
  balanced assignment (N/G experts per cluster) minimising the summed squared distance, by the
  Hungarian method on the centroids repeated N/G times, then centroid update, until stable (at
  most 20 rounds).
- stage 2, tokens, separately: feature of token u = Cp[l, u] (its routing distribution over the
  N experts), weight a[u]. sklearn KMeans (sample_weight=a, same seeding) seeds G centroids; then
  balanced Lloyd iterations where each cluster takes at most 1.05 * sum(a) / G of token frequency:
  tokens in decreasing regret (2nd-nearest minus nearest distance) take their nearest cluster
  with room (the least-filled cluster when none has room), at most 3 rounds.
- linking the stages: token clusters are matched one-to-one to expert groups by the Hungarian
  method maximising the activations that become local (sum of a[u] * mass of u on the group).
  Group g is device g's experts; a token's device is its matched group.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.optimize import linear_sum_assignment
from threadpoolctl import threadpool_limits

from sempar.affinity.affinity_stats import AffinityStats
from sempar.console import warnings_as_note
from sempar.placement.base import SOLVERS, PlacementProblem, coclustered_placement
from sempar.placement.placement import Placement

KMEANS_N_INIT = 1
EXPERT_ROUNDS = 20
TOKEN_ROUNDS = 3
TOKEN_SLACK = 0.05    # a token cluster may exceed sum(a) / G by 5% (METIS' ufactor is 3%)


def _layer(stats: AffinityStats, l: int) -> tuple[np.ndarray, np.ndarray]:
    """(Cp float32[U, N], counts int64[U, N]) of layer l, dense (these baselines run on small
    problems; one layer at a time)."""
    C = stats.counts(l)
    return stats.cp(l).toarray(), C.toarray().astype(np.int64)


# ---------------------------------------------------------------------------------------- metis

def fix_expert_counts(part: np.ndarray, aff: np.ndarray, cap: int) -> tuple[np.ndarray, int]:
    """(part int[N] with exactly `cap` experts per part, number of moves).

    aff float[N, G]: affinity of each expert to each part. Repeatedly moves the (expert of an
    over-full part, under-full part) pair with the smallest affinity loss aff[e, own] - aff[e, q].
    """
    part = part.copy()
    G = aff.shape[1]
    moves = 0
    while True:
        cnt = np.bincount(part, minlength=G)
        over, under = np.flatnonzero(cnt > cap), np.flatnonzero(cnt < cap)
        if over.size == 0:
            return part, moves
        cand = np.flatnonzero(np.isin(part, over))
        loss = aff[cand, part[cand]][:, None] - aff[cand][:, under]             # [cand, under]
        i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
        part[cand[i]] = under[j]
        moves += 1


def metis_layer(counts: np.ndarray, a: np.ndarray, G: int, seed: int):
    """(expert part int[N], token part int[U], edge cut, fix-up moves) for one layer.

    counts int[U, N]: token-expert co-activations; a float[U]: token frequencies.
    """
    import pymetis

    U, N = counts.shape
    C = sparse.csr_matrix(counts)
    C.eliminate_zeros()
    adj = sparse.bmat([[None, C], [C.T, None]], format="csr")                    # (U+N)^2
    adj.sort_indices()
    load = counts.sum(axis=0)
    vw = np.concatenate([np.rint(a).astype(np.int64), load]).astype(np.int64)
    if G == 1:
        part = np.zeros(U + N, np.int64)
        cut = 0
    else:
        cut, part = pymetis.part_graph(
            G, pymetis.CSRAdjacency(adj.indptr.astype(np.int64), adj.indices.astype(np.int64)),
            vweights=vw, eweights=adj.data.astype(np.int64), options=pymetis.Options(seed=seed))
        part = np.asarray(part, np.int64)
    tok_part, exp_part = part[:U], part[U:]
    aff = np.stack([counts[tok_part == g].sum(axis=0) for g in range(G)], axis=1).astype(float)
    exp_part, moves = fix_expert_counts(exp_part, aff, N // G)
    return exp_part, tok_part, int(cut), moves


@SOLVERS.register("metis", replicas=False, preserves_groups=False, mode_aware=False,
                  needs_token_ids=True)   # co-clusters tokens by id (base.py)
def metis(p: PlacementProblem) -> Placement:
    """s-MoE §5.7 METIS baseline: min k-cut of the token-expert co-activation graph per layer,
    then equal expert counts per part (see the module docstring for the choices)."""
    G = p.num_devices
    stats = AffinityStats(p.trace)
    groups, tdev, cuts, moves = [], [], [], []
    for l in range(stats.L):
        e, t, cut, mv = metis_layer(_layer(stats, l)[1], stats.a, G, p.seed)
        groups.append(e)
        tdev.append(t)
        cuts.append(cut)
        moves.append(mv)
    return coclustered_placement(p, "metis", np.stack(groups), stats, np.stack(tdev),
                                 {"edge_cut": cuts, "fixup_moves": moves})


# ------------------------------------------------------------------------------------- kmeans2d

def _sqdist(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    return np.maximum((X * X).sum(1)[:, None] - 2 * X @ C.T + (C * C).sum(1)[None, :], 0.0)


def balanced_expert_kmeans(X: np.ndarray, G: int, seed: int) -> np.ndarray:
    """int[N]: N/G rows of X float[N, D] per cluster (stage 1, balanced Lloyd + Hungarian)."""
    from sklearn.cluster import KMeans

    N = X.shape[0]
    cap = N // G
    if G == 1:
        return np.zeros(N, np.int64)
    C = KMeans(n_clusters=G, n_init=KMEANS_N_INIT, random_state=seed).fit(X).cluster_centers_
    lab = None
    for _ in range(EXPERT_ROUNDS):
        d = _sqdist(X, C)
        _, col = linear_sum_assignment(np.repeat(d, cap, axis=1))
        new = col // cap
        if lab is not None and np.array_equal(new, lab):
            break
        lab = new
        C = np.stack([X[lab == g].mean(axis=0) for g in range(G)])
    return lab


def balanced_token_kmeans(X: np.ndarray, w: np.ndarray, G: int, seed: int) -> np.ndarray:
    """int[U]: clusters of rows of X float[U, D] weighing w[U], each holding at most
    (1 + TOKEN_SLACK) * sum w / G of the weight (stage 2: balanced Lloyd, greedy capacity
    assignment)."""
    from sklearn.cluster import KMeans

    U = X.shape[0]
    if G == 1 or U == 0:
        return np.zeros(U, np.int64)
    km = KMeans(n_clusters=min(G, U), n_init=KMEANS_N_INIT, random_state=seed)
    C = km.fit(X, sample_weight=w).cluster_centers_
    if C.shape[0] < G:                                            # fewer tokens than devices
        C = np.concatenate([C, np.repeat(C[:1], G - C.shape[0], axis=0)])
    cap = (1.0 + TOKEN_SLACK) * float(w.sum()) / G
    wl = w.tolist()
    lab = None
    for _ in range(TOKEN_ROUNDS):
        d = _sqdist(X, C)
        pref = np.argsort(d, axis=1, kind="stable")
        sd = np.take_along_axis(d, pref[:, :2], axis=1)
        order = np.argsort(-(sd[:, 1] - sd[:, 0]), kind="stable").tolist()
        prefl = pref.tolist()
        fill = [0.0] * G
        new = [0] * U
        for u in order:
            wu = wl[u]
            for g in prefl[u]:
                if fill[g] + wu <= cap:
                    break
            else:
                g = min(range(G), key=fill.__getitem__)
            new[u] = g
            fill[g] += wu
        new = np.asarray(new, np.int64)
        if lab is not None and np.array_equal(new, lab):
            break
        lab = new
        C = np.stack([np.average(X[lab == g], axis=0, weights=w[lab == g]) if (lab == g).any()
                      else C[g] for g in range(G)])
    return lab


@SOLVERS.register("kmeans2d", replicas=False, preserves_groups=False, mode_aware=False,
                  needs_token_ids=True)   # co-clusters tokens by id (base.py)
def kmeans2d(p: PlacementProblem) -> Placement:
    """s-MoE §5.7 2D balanced k-means baseline: balanced k-means of experts, balanced k-means of
    tokens, token clusters matched to expert groups (see the module docstring for the choices)."""
    G = p.num_devices
    from sklearn.exceptions import ConvergenceWarning

    stats = AffinityStats(p.trace)
    groups, tdev = [], []
    # threads: small problems only add overhead; ConvergenceWarning: duplicate points (e.g. a
    # trace of one repeated token) leave fewer distinct clusters than devices, said once
    with threadpool_limits(1), warnings_as_note(ConvergenceWarning, "kmeans2d"):
        for l in range(stats.L):
            Cp, counts = _layer(stats, l)
            groups_l, tdev_l = _kmeans2d_layer(Cp, counts, stats.a, G, p.seed)
            groups.append(groups_l)
            tdev.append(tdev_l)
    return coclustered_placement(p, "kmeans2d", np.stack(groups), stats, np.stack(tdev), {})


def _kmeans2d_layer(Cp: np.ndarray, counts: np.ndarray, a: np.ndarray, G: int, seed: int):
    """(expert group int[N], token device int[U]) for one layer."""
    load = counts.sum(axis=0).astype(float)
    prof = (counts / np.maximum(load, 1.0)[None, :]).T                          # [N, U]
    prof = prof / np.maximum(np.linalg.norm(prof, axis=1, keepdims=True), 1e-12)
    egrp = balanced_expert_kmeans(prof, G, seed)
    tcl = balanced_token_kmeans(Cp.astype(np.float64), a, G, seed)
    mass = np.stack([Cp[:, egrp == g].sum(axis=1) for g in range(G)], axis=1)    # [U, G]
    gain = np.stack([(a[tcl == c, None] * mass[tcl == c]).sum(axis=0) for c in range(G)])
    rows, cols = linear_sum_assignment(-gain)                                    # cluster -> group
    match = np.empty(G, np.int64)
    match[rows] = cols
    return egrp, match[tcl]

