"""Numba kernels over device sets D (S of the N experts) for `colgen_bound`: the value U(D) of a
set, a swap search for sets of high reduced cost U(D) - mu(D), and the exact maximum of that
reduced cost over all C(N, S) sets (a depth-first enumeration with pruning).

U(D) = sum_{m = 1..M} min(C, n_m(D)), n_m(D) the rows with at least m experts in D, C the
rows one device may home: the top-C sum of h_t = |S_t ∩ D| over the layer's rows (h_t integer,
so the top-C sum is the sum over levels of min(C, rows reaching the level)). With C = the sum of
the tp batches' caps it is at least `device_bound`'s V(D) (each batch's top ceil(n_b / G) rows
are C rows of the layer), so a bound on U bounds V.

Rows are grouped by expert set (int32[n, k] `sets`, float64[n] `count`); `ptr`, `idx` list the
groups of each expert (CSR); h int8[n] holds |S_g ∩ D| of the set being built and lev float64[M + 1]
the rows at each level (lev[m] = n_m).
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
def _add(e, ptr, idx, count, h, lev):
    for j in range(ptr[e], ptr[e + 1]):
        g = idx[j]
        h[g] += 1
        lev[h[g]] += count[g]


@njit(cache=True)
def _remove(e, ptr, idx, count, h, lev):
    for j in range(ptr[e], ptr[e + 1]):
        g = idx[j]
        lev[h[g]] -= count[g]
        h[g] -= 1


@njit(cache=True)
def _value(lev, C):
    v = 0.0
    for m in range(1, lev.size):
        v += min(C, lev[m])
    return v


@njit(cache=True)
def set_value(member, ptr, idx, count, C, M):
    """U(D) of member bool[N]."""
    h = np.zeros(count.size, np.int8)
    lev = np.zeros(M + 1)
    for e in range(member.size):
        if member[e]:
            _add(e, ptr, idx, count, h, lev)
    return _value(lev, C)


@njit(cache=True)
def swap_search(start, mu, load, cap, ptr, idx, count, C, M, max_passes):
    """(bool[N] a set, its U - mu) by best-improvement swaps from start bool[N] (load <= cap)."""
    N = start.size
    cur = start.copy()
    h = np.zeros(count.size, np.int8)
    lev = np.zeros(M + 1)
    ld = 0.0
    for e in range(N):
        if cur[e]:
            _add(e, ptr, idx, count, h, lev)
            ld += load[e]
    val = _value(lev, C)
    for _ in range(max_passes):
        best, ba, bb = 1e-9, -1, -1
        for a in range(N):
            if not cur[a]:
                continue
            _remove(a, ptr, idx, count, h, lev)
            for b in range(N):
                if cur[b] or ld - load[a] + load[b] > cap:
                    continue
                _add(b, ptr, idx, count, h, lev)
                gain = _value(lev, C) - val - mu[b] + mu[a]
                _remove(b, ptr, idx, count, h, lev)
                if gain > best:
                    best, ba, bb = gain, a, b
            _add(a, ptr, idx, count, h, lev)
        if ba < 0:
            break
        _remove(ba, ptr, idx, count, h, lev)
        _add(bb, ptr, idx, count, h, lev)
        cur[ba], cur[bb] = False, True
        ld += load[bb] - load[ba]
        val = _value(lev, C)
    red = val
    for e in range(N):
        if cur[e]:
            red -= mu[e]
    return cur, red


@njit(cache=True)
def exact_scan(S, mu, load, cap, ptr, idx, count, cnt1, A2, C, M, K, floor, max_nodes):
    """The K sets of largest U(D) - mu(D) over every S-set D with load[D].sum() <= cap, exactly:
    (float64[K] their reduced costs, descending, -inf where fewer; int64[K, S] the sets,
    whether it finished: False once it has expanded max_nodes nodes, and then nothing is proved).

    Pruning never drops a set that could enter the top K: a subtree is cut when an upper bound
    of its sets' reduced cost is at most the current K-th best (or `floor`: a set at or below
    it is not wanted). The bound at a node F (d experts, r = S - d to add from the experts after
    F's last): U(F) + sum_m max(0, C - n_m(F)) (room left at each level) - mu(F) - the r
    smallest prices among the candidates; for the last expert b it is sharper: level 1 gains at
    most cnt1[b] rows, level m >= 2 at most the rows holding b and some expert of F
    (sum_{x in F} A2[b, x], A2 the pair co-activation)."""
    N = mu.size
    best_v = np.full(K, -np.inf)
    best_s = np.full((K, S), -1, np.int64)
    h = np.zeros(count.size, np.int8)
    lev = np.zeros(M + 1)
    chosen = np.zeros(S, np.int64)
    p2 = np.zeros((S + 1, N))              # p2[d, b] = sum over the first d chosen of A2[b, x]
    mus = np.zeros(S + 1)
    lds = np.zeros(S + 1)
    nxt = np.zeros(S + 1, np.int64)         # next candidate at each depth
    gain = np.zeros(N)
    top2 = np.zeros((N, S + 1))               # top2[b, j]: the j largest A2[b, :] summed
    for b in range(N):
        srt = np.sort(A2[b])[::-1]
        for j in range(1, min(S, N) + 1):
            top2[b, j] = top2[b, j - 1] + srt[j - 1]
    low = np.zeros((N + 1, S + 1))          # low[e, r]: the r smallest prices among mu[e:]
    for e in range(N):
        srt = np.sort(mu[e:])
        for r in range(1, min(S, N - e) + 1):
            low[e, r] = low[e, r - 1] + srt[r - 1]
    d = 0
    nxt[0] = 0
    nodes = 0
    while d >= 0:
        if nodes > max_nodes:
            return best_v, best_s, False
        e = nxt[d]
        thr = max(best_v[K - 1], floor)
        if d == S - 1:
            room1 = max(0.0, C - lev[1])
            base = _value(lev, C) - mus[d]
            for b in range(e, N):
                if lds[d] + load[b] > cap:
                    continue
                ub = base - mu[b] + min(room1, cnt1[b])
                for m in range(2, M + 1):
                    ub += min(max(0.0, C - lev[m]), p2[d, b])
                if ub <= thr:
                    continue
                _add(b, ptr, idx, count, h, lev)
                v = _value(lev, C) - mus[d] - mu[b]
                _remove(b, ptr, idx, count, h, lev)
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
                _remove(chosen[d], ptr, idx, count, h, lev)
            continue
        if e > N - (S - d):
            d -= 1
            if d >= 0:
                _remove(chosen[d], ptr, idx, count, h, lev)
            continue
        nxt[d] = e + 1
        if lds[d] + load[e] > cap:
            continue
        # bound of the subtree with e chosen at depth d: the r experts still to add raise
        # U by at most the room left, and each (b) by at most g(b) (module docstring of
        # exact_scan), so U - mu gains at most min(room - r smallest prices, r largest g - mu)
        r = S - d - 1
        room = 0.0
        for m in range(1, M + 1):
            room += max(0.0, C - lev[m])
        base = _value(lev, C) - mus[d] - mu[e]
        ub = base + room - low[e + 1, r]
        if ub > thr and r > 0:
            sat = lev[1] >= C
            ge = cnt1[e]                      # e's own gain, the same bound
            if sat:
                ge = min(ge, p2[d, e] + top2[e, r])
            for b in range(e + 1, N):
                gb = cnt1[b]
                if sat:
                    gb = min(gb, p2[d, b] + A2[b, e] + top2[b, r - 1])
                gain[b] = gb - mu[b]
            ub = min(ub, base + ge + np.sort(gain[e + 1:])[::-1][:r].sum())
        if ub <= thr:
            continue
        chosen[d] = e
        nodes += 1
        _add(e, ptr, idx, count, h, lev)
        mus[d + 1] = mus[d] + mu[e]
        lds[d + 1] = lds[d] + load[e]
        p2[d + 1] = p2[d] + A2[:, e]
        nxt[d + 1] = e + 1
        d += 1
    return best_v, best_s, True
