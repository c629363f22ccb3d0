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

Live finish (ours, `PluginConfig.finish_live`): the robust loop stops when no swap lowers the
worst (scenario, device) peak, which can be a split's peak no swap can cut while the live
window is still above its bound (measured at 17 scenarios on a FILE profiled away from the
traffic: GPT-OSS-20B EP 8 live max / mean 1.149 against the engines' 1.026). `balance_swaps`
then goes on with the live window's peak alone on the swaps left, taking only swaps that keep
every scenario at or below the worst peak the robust loop left (so the next rebalance's robust
loop is not handed a peak it would undo), so the map the engine gets meets the live bound
wherever a swap can reach it without giving up the robust bound.
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
               per_cut=False, ceiling=np.inf):  # pragma: no cover
    """In place: load float64[K, G] (scenario 0: the live window), hosts bool[G, N], ee
    int64[P] expert of each slot (slot p on device p // S), share float64[K, N] load of one
    copy per scenario (every scenario of the same total), aff float64[G, N], A float32[N, N],
    caps float64[K] each scenario's bound on max / mean. A finite `ceiling`: the live finish
    (module docstring), the peak is the live window's (scenario 0) alone and a swap may not
    lift any scenario's load / cap above it. Returns the swaps made."""
    live = ceiling < np.inf
    K, G = load.shape
    P = ee.size
    N = share.shape[1]
    cut = np.empty((S, P))
    for it in range(max_swaps):
        mean = load[0].sum() / G
        h = 0
        kh = 0
        for k in range(1 if live else K):
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
                worst = 0.0
                for k in range(K):
                    delta = share[k, a] - share[k, b]
                    after = max(load[k, h] - delta, load[k, d] + delta) / caps[k]
                    worst = max(worst, after)
                    if k == 0 or not live:
                        new = max(new, after)
                if live and worst > ceiling + EPS:
                    continue
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


def balance_swaps(load: np.ndarray, hosts: np.ndarray, ee: np.ndarray, share: np.ndarray,
                  aff: np.ndarray, A: np.ndarray, S: int, caps: np.ndarray, max_swaps: int,
                  min_cut: float = 0.5, per_cut: bool = False, finish_live: bool = True) -> int:
    """`swap_loop` on every scenario, then (`finish_live`, module docstring) the live finish
    while the live window is above caps[0], the two in turn until neither finds a swap or the
    swaps run out (a fixpoint: the next rebalance's loops, started from this map, find nothing
    to do). Same arrays as `swap_loop` (hosts, ee, aff and load changed in place). Returns the
    swaps made."""
    made = swap_loop(load, hosts, ee, share, aff, A, S, caps, max_swaps, min_cut, per_cut)
    if not finish_live or load.shape[0] == 1:
        return made
    while made < max_swaps and load[0].max() > caps[0] * load[0].mean() + EPS:
        ceiling = float((load / caps[:, None]).max())     # the worst peak the loop left
        live = swap_loop(load, hosts, ee, share, aff, A, S, caps, max_swaps - made, min_cut,
                         per_cut, ceiling)
        made += live
        if live == 0 or made >= max_swaps:
            break
        robust = swap_loop(load, hosts, ee, share, aff, A, S, caps, max_swaps - made, min_cut,
                           per_cut)
        made += robust
        if robust == 0:
            break
    return made
