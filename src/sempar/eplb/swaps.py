"""The balance swaps of the engine-balancer policy (`policy._layout`, step 4), compiled with
numba (cached on disk): at DeepSeek-V3 shape a layer may need a hundred swaps, and each scans
the S x P (copy on the hottest device, copy elsewhere) pairs twice.

Rule (the balance-first rule of `placement/sempar/experts.py`'s swap search, restricted to the
hottest device): while the hottest device h is above `cap_ratio` x the mean load, over the swaps
of a copy a on h with a copy b on another device d (d hosting no copy of a, h none of b) that
lower max(load h, load d), take, among those whose cut is at least half the best cut, the one
that loses the least affinity: aff[h, a] + aff[d, b] - (aff[d, a] - A[a, b]) - (aff[h, b] -
A[a, b]), with aff[g, e] the summed pair affinity of e with the experts on g.

Robust form (ours, `PluginConfig.scenarios`): the loads are K scenarios at once (the live
window and K - 1 splits of FILE's rows, `policy.scenario_loads`, each scaled to the window's
total), load float64[K, G] and share float64[K, N], each scenario k with its own bound
caps[k] (the live window `max_imbalance`, the splits that + `scenario_slack`: a split holds
fewer rows, so its loads are noisier; `drift/history.py`'s robust bound does the same for older
windows). Loads are compared as load / caps[k]: the hottest device is the (scenario, device)
with the highest, a swap's cut is that peak minus the pair's new peak over every scenario, so a
swap that relieves h in one scenario and overloads d in another scores by the worse of the
two, and a group of experts that spike together in some split is pulled apart. With K = 1 it
is the rule above, step for step.
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


def _swap_loop(load, hosts, ee, share, aff, A, S, caps, max_swaps, min_cut=0.5,
               per_cut=False):  # pragma: no cover
    """In place: load float64[K, G] (scenario 0: the live window), hosts bool[G, N], ee
    int64[P] expert of each slot (slot p on device p // S), share float64[K, N] load of one
    copy per scenario (every scenario of the same total), aff float64[G, N], A float32[N, N],
    caps float64[K] each scenario's bound on max / mean. Returns the swaps made."""
    K, G = load.shape
    P = ee.size
    N = share.shape[1]
    cut = np.empty((S, P))
    for it in range(max_swaps):
        mean = load[0].sum() / G
        h = 0
        kh = 0
        for k in range(K):
            for g in range(G):
                if load[k, g] / caps[k] > load[kh, h] / caps[kh]:
                    h = g
                    kh = k
        peak = load[kh, h] / caps[kh]
        if peak <= mean + EPS:
            return it
        best = 0.0
        for i in range(S):                        # pass 1: every allowed swap's cut
            a = ee[h * S + i]
            for j in range(P):
                cut[i, j] = -1.0
                d = j // S
                b = ee[j]
                if d == h or hosts[d, a] or hosts[h, b] or share[kh, a] - share[kh, b] <= EPS:
                    continue
                new = 0.0
                for k in range(K):
                    delta = share[k, a] - share[k, b]
                    new = max(new, max(load[k, h] - delta, load[k, d] + delta) / caps[k])
                cut[i, j] = peak - new
                best = max(best, cut[i, j])
        if best <= EPS:
            return it
        low = np.inf
        bi = -1
        bj = -1
        for i in range(S):                        # pass 2: the least affinity lost
            a = ee[h * S + i]
            for j in range(P):
                if cut[i, j] < min_cut * best or cut[i, j] <= EPS:
                    continue
                b = ee[j]
                d = j // S
                ab = A[a, b]
                loss = aff[h, a] + aff[d, b] - (aff[d, a] - ab) - (aff[h, b] - ab)
                if per_cut:
                    loss = loss / cut[i, j]
                if loss < low:
                    low = loss
                    bi = h * S + i
                    bj = j
        a = ee[bi]
        b = ee[bj]
        d = bj // S
        hosts[h, a] = False
        hosts[d, b] = False
        hosts[h, b] = True
        hosts[d, a] = True
        ee[bi] = b
        ee[bj] = a
        for k in range(K):
            delta = share[k, a] - share[k, b]
            load[k, h] -= delta
            load[k, d] += delta
        for e in range(N):
            diff = A[b, e] - A[a, e]
            aff[h, e] += diff
            aff[d, e] -= diff
    return max_swaps


swap_loop = _jit(_swap_loop)
