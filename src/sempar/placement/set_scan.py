"""Numba kernels over device sets D (S of the N experts) for `colgen_bound`: the value U(D) of a
set, a swap search for sets of high reduced cost U(D) - mu(D), and the exact maximum of that
reduced cost over all C(N, S) sets (a depth-first enumeration with pruning).

The layer's rows are split into Q parts (runs of whole tp batches). U(D) = sum over parts q and
levels m = 1..M of min(C_q, n_qm(D)), n_qm(D) the rows of part q with at least m experts in D,
C_q the rows one device may home there (the sum of the part's batches' caps ceil(n_b / G)): per
part the top-C_q sum of h_t = |S_t ∩ D| (h_t integer, so a top-C sum is the sum over levels of
min(C, rows reaching the level)). It is at least `device_bound`'s V(D) (each batch's top
ceil(n_b / G) rows are C_q rows of its part) and equal to it with one part a batch, so a bound
on U bounds V; fewer parts are cheaper and looser.

Rows are grouped by (part, expert set): float64[n] `count`, int64[n] `part`; `ptr`, `idx` list
the groups of each expert (CSR); h int8[n] holds |S_g ∩ D| of the set being built and lev
float64[Q, M + 1] the rows at each level (lev[q, m] = n_qm).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def coactivation(experts: np.ndarray, N: int) -> np.ndarray:
    """float64[N, N]: A[e, f] = rows selecting both e and f (zero diagonal); experts int[T, k]."""
    ex = np.asarray(experts, np.int64)
    T, k = ex.shape
    i, j = np.triu_indices(k, 1)
    A = np.bincount((ex[:, i] * N + ex[:, j]).ravel(), minlength=N * N).reshape(N, N)
    A = (A + A.T).astype(np.float64)
    np.fill_diagonal(A, 0.0)
    return A


@njit(cache=True)
def _add(e, ptr, idx, count, part, h, lev):
    for j in range(ptr[e], ptr[e + 1]):
        g = idx[j]
        h[g] += 1
        lev[part[g], h[g]] += count[g]


@njit(cache=True)
def _remove(e, ptr, idx, count, part, h, lev):
    for j in range(ptr[e], ptr[e + 1]):
        g = idx[j]
        lev[part[g], h[g]] -= count[g]
        h[g] -= 1


@njit(cache=True)
def _value(lev, C):
    v = 0.0
    for q in range(lev.shape[0]):
        for m in range(1, lev.shape[1]):
            v += min(C[q], lev[q, m])
    return v


@njit(cache=True)
def set_value(member, ptr, idx, count, part, C, M):
    """U(D) of member bool[N]; C float64[Q] the parts' caps."""
    h = np.zeros(count.size, np.int8)
    lev = np.zeros((C.size, M + 1))
    for e in range(member.size):
        if member[e]:
            _add(e, ptr, idx, count, part, h, lev)
    return _value(lev, C)


@njit(cache=True)
def swap_search(start, mu, load, cap, ptr, idx, count, part, C, M, max_passes, A, width):
    """(bool[N] a set, its U - mu) by best-improvement swaps from start bool[N] (load <= cap).

    A float64[N, N]: the pair co-activation summed over parts; width > 0: of the experts b
    that could come in for a, only the `width` best by the proxy A[b, D - a] - mu_b are valued
    exactly (a pricing heuristic: the exact scan certifies the bound, not this search)."""
    N = start.size
    cur = start.copy()
    h = np.zeros(count.size, np.int8)
    lev = np.zeros((C.size, M + 1))
    ld = 0.0
    for e in range(N):
        if cur[e]:
            _add(e, ptr, idx, count, part, h, lev)
            ld += load[e]
    val = _value(lev, C)
    prox = np.zeros(N)
    for _ in range(max_passes):
        best, ba, bb = 1e-9, -1, -1
        for b in range(N):                  # A[b, D]
            t = 0.0
            for x in range(N):
                if cur[x]:
                    t += A[b, x]
            prox[b] = t - mu[b]
        for a in range(N):
            if not cur[a]:
                continue
            _remove(a, ptr, idx, count, part, h, lev)
            if width > 0:
                cand = np.full(N, -np.inf)
                for b in range(N):
                    if not cur[b] and ld - load[a] + load[b] <= cap:
                        cand[b] = prox[b] - A[b, a]
                order = np.argsort(-cand)[:width]
            else:
                order = np.arange(N)
            for b in order:
                if cur[b] or ld - load[a] + load[b] > cap:
                    continue
                _add(b, ptr, idx, count, part, h, lev)
                gain = _value(lev, C) - val - mu[b] + mu[a]
                _remove(b, ptr, idx, count, part, h, lev)
                if gain > best:
                    best, ba, bb = gain, a, b
            _add(a, ptr, idx, count, part, h, lev)
        if ba < 0:
            break
        _remove(ba, ptr, idx, count, part, h, lev)
        _add(bb, ptr, idx, count, part, h, lev)
        cur[ba], cur[bb] = False, True
        ld += load[bb] - load[ba]
        val = _value(lev, C)
    red = val
    for e in range(N):
        if cur[e]:
            red -= mu[e]
    return cur, red


@njit(cache=True)
def exact_scan(S, mu, load, cap, ptr, idx, count, part, cnt1, A2, C, M, K, floor, max_nodes):
    """The K sets of largest U(D) - mu(D) over every S-set D with load[D].sum() <= cap, exactly:
    (float64[K] their reduced costs, descending, -inf where fewer; int64[K, S] the sets,
    whether it was exact, an upper bound of the subtrees it left open: -inf when exact).
    Once it has expanded max_nodes nodes it expands no more: it walks back up the tree, and of
    each subtree still unexplored whose bound is above the K-th best (or `floor`) it keeps the
    largest bound instead, so max(the best found, that bound, floor) still bounds the reduced
    cost of every set (what the Lagrangian bound needs), only less tightly.
    cnt1 float64[Q, N]: rows of each part holding each expert; A2 float64[Q, N, N]: the parts'
    pair co-activation.

    Pruning never drops a set that could enter the top K: a subtree is cut when an upper bound
    of its sets' reduced cost is at most the current K-th best (or `floor`: a set at or below
    it is not wanted). The bound at a node F (d experts, r = S - d to add from the experts after
    F's last): U(F) + sum_qm max(0, C_q - n_qm(F)) (room left at each level) - mu(F) - the r
    smallest prices among the candidates; for the last expert b it is sharper: in part q level 1
    gains at most cnt1[q, b] rows, level m >= 2 at most the rows holding b and some expert of F
    (sum_{x in F} A2[q, b, x]). Inside the tree the bound is also at most the r largest
    g(b) - mu_b, g(b) the most one added expert b raises U: per part cnt1[q, b] rows, and once
    the part's level 1 is full (n_q1(F) >= C_q: a row's first expert in D adds nothing there)
    the rows holding b and another expert of D, at most sum_{x in F} A2[q, b, x] + the r - 1
    largest A2[q, b, :] (the other added experts)."""
    N = mu.size
    Q = C.size
    best_v = np.full(K, -np.inf)
    best_s = np.full((K, S), -1, np.int64)
    h = np.zeros(count.size, np.int8)
    lev = np.zeros((Q, M + 1))
    chosen = np.zeros(S, np.int64)
    p2 = np.zeros((S + 1, Q, N))            # p2[d, q, b] = sum over the first d chosen x of A2[q, b, x]
    mus = np.zeros(S + 1)
    lds = np.zeros(S + 1)
    nxt = np.zeros(S + 1, np.int64)         # next candidate at each depth
    # topT[j, q, b]: the j largest A2[q, b, :] summed (b last: the loops below run over b)
    topT = np.zeros((S + 1, Q, N))
    for q in range(Q):
        for b in range(N):
            srt = np.sort(A2[q, b])[::-1]
            for j in range(1, min(S, N) + 1):
                topT[j, q, b] = topT[j - 1, q, b] + srt[j - 1]
    low = np.zeros((N + 1, S + 1))          # low[e, r]: the r smallest prices among mu[e:]
    for e in range(N):
        srt = np.sort(mu[e:])
        for r in range(1, min(S, N - e) + 1):
            low[e, r] = low[e, r - 1] + srt[r - 1]
    # per depth, fixed while its candidates are tried: U(F) and the room left at every level
    vald = np.zeros(S + 1)
    roomd = np.zeros(S + 1)
    rq = np.zeros((Q, M + 1))               # the room of each part and level at a leaf visit
    ubv = np.zeros(N)
    topr = np.zeros(S + 1)                  # the r largest gains (insertion, descending)
    vald[0] = 0.0
    for q in range(Q):
        roomd[0] += M * C[q]
    d = 0
    nxt[0] = 0
    nodes = 0
    open_ub = -np.inf                       # the largest bound of a subtree left unexplored
    while d >= 0:
        e = nxt[d]
        thr = max(best_v[K - 1], floor)
        if d == S - 1:
            # every last expert b at once: U gains at most, per part, min(room at level 1,
            # cnt1[q, b]) + per level m >= 2 min(room, rows holding b and some x in F)
            base = vald[d] - mus[d]
            for q in range(Q):
                for m in range(1, M + 1):
                    rq[q, m] = max(0.0, C[q] - lev[q, m])
            for b in range(e, N):
                ubv[b] = base - mu[b]
            for q in range(Q):
                r1 = rq[q, 1]
                for b in range(e, N):
                    x = p2[d, q, b]
                    u = min(r1, cnt1[q, b])
                    for m in range(2, M + 1):
                        # a row reaching level m holds b and >= m - 1 experts of F, so it
                        # counts >= m - 1 times in x (the pairs of b with F)
                        u += min(rq[q, m], x / (m - 1))
                    ubv[b] += u
            for b in range(e, N):
                if lds[d] + load[b] > cap or ubv[b] <= thr:
                    continue
                _add(b, ptr, idx, count, part, h, lev)
                v = _value(lev, C) - mus[d] - mu[b]
                _remove(b, ptr, idx, count, part, h, lev)
                if v > thr:
                    j = K - 1
                    while j > 0 and best_v[j - 1] < v:
                        best_v[j] = best_v[j - 1]
                        best_s[j] = best_s[j - 1]
                        j -= 1
                    best_v[j] = v
                    best_s[j, :S - 1] = chosen[:S - 1]
                    best_s[j, S - 1] = b
                    thr = max(best_v[K - 1], floor)
            d -= 1
            if d >= 0:
                _remove(chosen[d], ptr, idx, count, part, h, lev)
            continue
        if e > N - (S - d):
            d -= 1
            if d >= 0:
                _remove(chosen[d], ptr, idx, count, part, h, lev)
            continue
        nxt[d] = e + 1
        if lds[d] + load[e] > cap:
            continue
        # bound of the subtree with e chosen at depth d: the r experts still to add raise
        # U by at most the room left, and each (b) by at most g(b) (docstring), so U - mu
        # gains at most min(room - r smallest prices, g(e) + r largest g - mu)
        r = S - d - 1
        base = vald[d] - mus[d] - mu[e]
        ub = base + roomd[d] - low[e + 1, r]
        if ub > thr and r > 0:
            ge = 0.0                            # e's own gain, the same bound
            for b in range(e + 1, N):
                ubv[b] = -mu[b]
            for q in range(Q):
                full = 0                        # levels 1..full of part q are at their cap
                while full < M and lev[q, full + 1] >= C[q]:
                    full += 1
                if full >= 1:
                    # b then gains only from rows holding >= full other experts of D, each
                    # counted >= full times in b's pairs with D
                    ge += min(cnt1[q, e], (p2[d, q, e] + topT[r, q, e]) / full)
                    for b in range(e + 1, N):
                        ubv[b] += min(cnt1[q, b], (p2[d, q, b] + A2[q, e, b]
                                                   + topT[r - 1, q, b]) / full)
                else:
                    ge += cnt1[q, e]
                    for b in range(e + 1, N):
                        ubv[b] += cnt1[q, b]
            for j in range(r):
                topr[j] = -np.inf
            for b in range(e + 1, N):           # the r largest, by insertion (r < S)
                g = ubv[b]
                if g > topr[r - 1]:
                    j = r - 1
                    while j > 0 and topr[j - 1] < g:
                        topr[j] = topr[j - 1]
                        j -= 1
                    topr[j] = g
            tot = 0.0
            for j in range(r):
                tot += topr[j]
            ub = min(ub, base + ge + tot)
        if ub <= thr:
            continue
        if nodes >= max_nodes:              # out of nodes: bound the subtree, do not enter it
            open_ub = max(open_ub, ub)
            continue
        chosen[d] = e
        nodes += 1
        _add(e, ptr, idx, count, part, h, lev)
        mus[d + 1] = mus[d] + mu[e]
        lds[d + 1] = lds[d] + load[e]
        for q in range(Q):
            p2[d + 1, q] = p2[d, q] + A2[q, e]
        vald[d + 1] = _value(lev, C)
        rm = 0.0
        for q in range(Q):
            for m in range(1, M + 1):
                rm += max(0.0, C[q] - lev[q, m])
        roomd[d + 1] = rm
        nxt[d + 1] = e + 1
        d += 1
    return best_v, best_s, open_ub == -np.inf, open_ub
