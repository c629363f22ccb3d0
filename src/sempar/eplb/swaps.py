"""The balance swaps of the engine-balancer policy (`policy._layout`, step 4), compiled with
numba (cached on disk): at DeepSeek-V3 shape a layer may need a hundred swaps, and each scans
the S x P (copy on the hottest device, copy elsewhere) pairs twice.

Rule (the balance-first rule of `placement/sempar/experts.py`'s swap search, restricted to the
hottest device): while the hottest device h is above `cap_ratio` x the mean load, over the swaps
of a copy a on h with a copy b on another device d (d hosting no copy of a, h none of b) that
lower max(load h, load d), take, among those whose cut is at least half the best cut, the one
that loses the least affinity: aff[h, a] + aff[d, b] - (aff[d, a] - A[a, b]) - (aff[h, b] -
A[a, b]), with aff[g, e] the summed pair affinity of e with the experts on g.
"""

from __future__ import annotations

import numpy as np
from numba import njit

EPS = 1e-12


def _jit(fn):
    """numba-compile with an on-disk cache; without one where no cache folder is writable."""
    try:
        return njit(cache=True)(fn)
    except RuntimeError:  # pragma: no cover - read-only install without a user cache
        return njit(fn)


def _swap_loop(load, hosts, ee, share, aff, A, S, cap_ratio, max_swaps):  # pragma: no cover
    """In place: load float64[G], hosts bool[G, N], ee int64[P] expert of each slot (slot p on
    device p // S), share float64[N] load of one copy, aff float64[G, N], A float32[N, N].
    Returns the swaps made."""
    G = load.size
    P = ee.size
    N = share.size
    cut = np.empty((S, P))
    for it in range(max_swaps):
        mean = load.sum() / G
        h = 0
        for g in range(G):
            if load[g] > load[h]:
                h = g
        if load[h] <= cap_ratio * mean + EPS:
            return it
        best = 0.0
        for i in range(S):                        # pass 1: every allowed swap's cut
            a = ee[h * S + i]
            for j in range(P):
                cut[i, j] = -1.0
                d = j // S
                b = ee[j]
                delta = share[a] - share[b]
                if d == h or delta <= EPS or hosts[d, a] or hosts[h, b]:
                    continue
                cut[i, j] = load[h] - max(load[h] - delta, load[d] + delta)
                best = max(best, cut[i, j])
        if best <= EPS:
            return it
        low = np.inf
        bi = -1
        bj = -1
        for i in range(S):                        # pass 2: the least affinity lost
            a = ee[h * S + i]
            for j in range(P):
                if cut[i, j] < 0.5 * best or cut[i, j] <= EPS:
                    continue
                b = ee[j]
                d = j // S
                ab = A[a, b]
                loss = aff[h, a] + aff[d, b] - (aff[d, a] - ab) - (aff[h, b] - ab)
                if loss < low:
                    low = loss
                    bi = h * S + i
                    bj = j
        a = ee[bi]
        b = ee[bj]
        d = bj // S
        delta = share[a] - share[b]
        hosts[h, a] = False
        hosts[d, b] = False
        hosts[h, b] = True
        hosts[d, a] = True
        ee[bi] = b
        ee[bj] = a
        load[h] -= delta
        load[d] += delta
        for e in range(N):
            diff = A[b, e] - A[a, e]
            aff[h, e] += diff
            aff[d, e] -= diff
    return max_swaps


swap_loop = _jit(_swap_loop)
