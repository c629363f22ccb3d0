"""Device sets as columns: V(D) for any device set D without listing all C(N, S) of them, and a
local search for sets of high reduced cost V(D) - mu(D) (the heuristic half of the pricing in
`colgen_bound`).

V(D) is `device_bound.device_values`'s value (module step 1 there): per tp batch b of n_b rows,
the sum of the ceil(n_b / G) largest |S_t ∩ D|. With h_t = |S_t ∩ D| in 0..M (M = min(k, S)),
the top-C sum of integers is sum_{m = 1..M} min(C, #{t: h_t >= m}), so V needs, per batch, how
many rows reach each level: one sparse product per level over the layer's distinct
(batch, expert set) groups, for many candidate sets at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sempar.placement.capacity import BATCH


@dataclass(frozen=True)
class RowGroups:
    """One layer's rows, grouped: rows of the same tp batch with the same expert set are one
    group (V only sees the set and the batch).

    sets: int64[n, k] each group's sorted experts; count: float64[n] its rows; batch: int64[n]
    its tp batch; cap: float64[B] each batch's per-device share ceil(n_b / G); N, S, M."""

    sets: np.ndarray
    count: np.ndarray
    batch: np.ndarray
    cap: np.ndarray
    N: int
    S: int
    M: int


def row_groups(experts: np.ndarray, N: int, G: int, batch: int = BATCH) -> RowGroups:
    """`RowGroups` of one layer's experts int[T, k] (distinct within a row) on G devices."""
    ex = np.sort(np.asarray(experts, np.int64), axis=1)
    T, k = ex.shape
    b = np.arange(T) // batch
    key = np.concatenate([b[:, None], ex], axis=1)
    uniq, count = np.unique(key, axis=0, return_counts=True)
    sizes = np.bincount(b)
    cap = -(-sizes // G)
    S = N // G
    return RowGroups(uniq[:, 1:].copy(), count.astype(np.float64), uniq[:, 0].copy(),
                     cap.astype(np.float64), N, S, min(k, S))


def set_values(g: RowGroups, member: np.ndarray) -> np.ndarray:
    """float64[m]: V(D) of each candidate set, member bool[m, N] (row i: D_i's experts)."""
    h = member[:, g.sets].sum(axis=2, dtype=np.int16)          # [m, n] experts of D per group
    return levels_value(g, h)


def levels_value(g: RowGroups, h: np.ndarray) -> np.ndarray:
    """float64[m]: sum over batches and levels j of min(cap_b, rows of b with h >= j), from
    h int[m, n] (each candidate's |S ∩ D| per group)."""
    starts = np.searchsorted(g.batch, np.arange(g.cap.size))   # groups sorted by batch
    w = g.count.astype(np.float32)
    out = np.zeros(h.shape[0])
    for j in range(1, g.M + 1):
        reach = h >= j
        if not reach.any():
            break
        per = np.add.reduceat(np.where(reach, w, np.float32(0)), starts, axis=1)  # [m, B]
        out += np.minimum(per.astype(np.float64), g.cap[None, :]).sum(axis=1)
    return out


def best_swap_set(g: RowGroups, mu: np.ndarray, start: np.ndarray,
                  allowed=None, max_passes: int = 50) -> tuple[np.ndarray, float]:
    """(bool[N] a device set, its V - mu) by steepest-ascent swaps (one expert out, one in)
    from `start` bool[N] (S experts) on the reduced cost V(D) - mu(D); allowed: None or a
    function bool[m, N] -> bool[m] (a side constraint, e.g. the load cap; `start` must meet it).
    A heuristic: it finds good columns, it proves nothing."""
    inc = incidence(g)                                           # int8[N, n]
    cur = start.copy()
    h = inc[cur].sum(axis=0, dtype=np.int8)
    val = float(levels_value(g, h[None])[0] - mu[cur].sum())
    for _ in range(max_passes):
        ins, outs = np.flatnonzero(cur), np.flatnonzero(~cur)
        a, b = np.repeat(ins, outs.size), np.tile(outs, ins.size)
        if allowed is not None:
            cand = np.repeat(cur[None], a.size, axis=0)
            cand[np.arange(a.size), a] = False
            cand[np.arange(a.size), b] = True
            ok = allowed(cand)
            a, b = a[ok], b[ok]
            if not a.size:
                break
        best_v, best = -np.inf, None
        for lo in range(0, a.size, 128):                         # [128, n] at a time
            aa, bb = a[lo:lo + 128], b[lo:lo + 128]
            hc = h[None] - inc[aa] + inc[bb]
            vals = levels_value(g, hc) - (mu[cur].sum() - mu[aa] + mu[bb])
            j = int(np.argmax(vals))
            if vals[j] > best_v:
                best_v, best = float(vals[j]), (int(aa[j]), int(bb[j]))
        if best_v <= val + 1e-9:
            break
        cur = cur.copy()
        cur[best[0]], cur[best[1]] = False, True
        h = h - inc[best[0]] + inc[best[1]]
        val = best_v
    return cur, val


def incidence(g: RowGroups) -> np.ndarray:
    """int8[N, n]: 1 where group n holds expert e."""
    inc = np.zeros((g.N, g.sets.shape[0]), np.int8)
    inc[g.sets, np.arange(g.sets.shape[0])[:, None]] = 1
    return inc
