"""Alg. 1 `sample` of s-MoE's cross-entropy co-clustering (speculative-moe.txt, lines 3-23),
vectorised: labels for K samples of P problems at once (`placement/cem.py` runs the CE loop).

Ours, the same distribution as line 11: each (sample, row)
draws its label with a uniform of its own; all samples of all problems advance together in
at most E rounds; a round finds in each sample the first row whose label fills a cluster,
settles the rows up to it and masks the cluster, and the later rows that had drawn it draw
again from norm(p[i] * mask) with the uniform left over from their first draw (checked
against a row-by-row implementation of lines 3-23 on 100k samples: same label frequencies).
"""

from __future__ import annotations

import numpy as np


def _draw(p: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(label int64[m], leftover uniform float64[m]): inverse-CDF draws from norm(p) rows.

    p float[m, E] (masked probabilities; an all-zero row falls back to uniform), v float[m] in
    [0, 1). The leftover (target - start of the label's interval) / its width is again uniform
    on [0, 1) and independent of the label: it is what a later re-draw of the row uses.
    """
    m, E = p.shape
    p = np.asarray(p, np.float64)
    zero = p.sum(axis=1) <= 0
    if zero.any():
        p = p.copy()
        p[zero] = 1.0
    cdf = np.cumsum(p, axis=1)
    target = v * cdf[:, -1]
    c = np.minimum((target[:, None] >= cdf[:, :-1]).sum(axis=1), E - 1)
    rows = np.arange(m)
    width = p[rows, c]
    left = np.clip((target - (cdf[rows, c] - width)) / width, 0.0, np.nextafter(1.0, 0.0))
    return c, left


def _leftover(u, pe, cdf, lab, v, redrawn, ra, rk, rj) -> np.ndarray:
    """float64[m]: the uniform left over from the current label's draw of rows (ra, rk, rj):
    from the first draw (u and the unmasked cdf), or from the last re-draw (v) if there was one."""
    E = pe.shape[2]
    c = lab[ra, rk, rj].astype(np.int64)
    width = pe[ra, rj, c]
    left = (u[ra, rk, rj] * cdf[ra, rj, E - 1] - (cdf[ra, rj, c] - width)) / width
    left = np.clip(left, 0.0, np.nextafter(1.0, 0.0))
    again = redrawn[ra, rk, rj]
    left[again] = v[ra[again], rk[again], rj[again]]
    return left


def sample_batch(p: np.ndarray, weights: np.ndarray, cap: np.ndarray, n_samples: int,
                 rng: np.random.Generator, order: np.ndarray | None = None) -> np.ndarray:
    """int8[P, K, n] (int16 above 127 clusters): Alg. 1 `sample` (lines 3-23), K samples for
    each of P problems.

    p float[P, n, E] label probabilities per row; weights float[P, n] what a row adds to its
    cluster's counter; cap float[P]: a cluster is masked for the rows visited after its counter
    reaches cap; order int[P, n] visiting order (None: rows 0..n-1, line 9).

    Vectorised (ours, same distribution as line 11): every (sample, row) draws its label from
    norm(p[i]) with a uniform u that is independent of the rows before it. All samples advance
    together in rounds: a round finds in each sample the first row whose label fills a cluster
    (cumulative sums, only for the (cluster, sample) pairs whose remaining weight can reach
    the room left), settles the rows up to it and masks that cluster; the rows after it that
    had drawn the masked cluster draw again from norm(p[i] * mask) with their leftover uniform
    (`_draw`). A row that had drawn an open cluster keeps it, which is the same law: a draw from
    norm(p * mask), conditioned on not hitting the newly masked cluster, is a draw from
    norm(p * mask') with the leftover uniform. At most E rounds.
    """
    P, n, E = p.shape
    K = n_samples
    if order is not None and np.array_equal(order, np.broadcast_to(np.arange(n), order.shape)):
        order = None                                                     # rows as they are
    if order is not None:
        p = np.take_along_axis(p, order[:, :, None], axis=1)
        weights = np.take_along_axis(weights, order, axis=1)
    pe = np.maximum(np.asarray(p, np.float64), 1e-12)                    # [P, n, E]
    w = np.asarray(weights, np.float32)[:, None, :]                      # [P, 1, n]
    cap = np.asarray(cap, np.float64).reshape(P, 1, 1)
    cdf = np.cumsum(pe, axis=2)                                          # shared first draw
    u = rng.random((P, K, n))
    target = u * cdf[:, None, :, -1]
    dt = np.int8 if E <= 127 else np.int16
    lab = np.zeros((P, K, n), dt)
    for e in range(E - 1):
        lab += target >= cdf[:, None, :, e]
    del target
    v = np.empty((P, K, n))                   # leftover uniform of each re-drawn row
    redrawn = np.zeros((P, K, n), bool)
    closed = np.zeros((P, K, E), bool)
    load = np.zeros((P, K, E))
    start = np.zeros((P, K), np.int64)
    todo = np.ones((P, K), bool)
    base = (np.arange(P * K, dtype=np.int64) * E).reshape(P, K, 1)
    while todo.any():
        lo = int(start[todo].min())                             # rows before lo are all settled
        pos = np.arange(lo, n)
        labs = lab[:, :, lo:]
        active = (pos >= start[:, :, None]) & todo[:, :, None]
        wa = w[:, :, lo:] * active                              # float32 [P, K, n - lo]
        key = (base + labs).ravel()
        tot = np.bincount(key, weights=wa.ravel(), minlength=P * K * E).reshape(P, K, E)
        room = cap - load
        can = (tot * (1 + 1e-5) + 1e-6 >= room) & ~closed & todo[:, :, None]
        hit = np.full((P, K), n)                                # first row that fills a cluster
        for e in np.flatnonzero(can.any(axis=(0, 1))):
            pi, ki = np.nonzero(can[:, :, e])
            cs = np.cumsum(wa[pi, ki] * (labs[pi, ki] == e), axis=1)
            full = cs >= room[pi, ki, e][:, None]
            h = np.where(full[:, -1], full.argmax(axis=1) + lo, n)
            hit[pi, ki] = np.minimum(hit[pi, ki], h)
        take = active & (pos <= hit[:, :, None])
        load += np.bincount(key, weights=(wa * take).ravel(), minlength=P * K * E).reshape(P, K, E)
        filled = todo & (hit < n)
        pi, ki = np.nonzero(filled)
        if pi.size:
            ce = labs[pi, ki, hit[pi, ki] - lo].astype(np.int64)
            closed[pi, ki, ce] = True
            gone = np.full((P, K), -1, np.int64)
            gone[pi, ki] = ce
            redo = (labs == gone[:, :, None]) & (pos > hit[:, :, None])
            ra, rk, rj = np.nonzero(redo)
            if ra.size:
                rj = rj + lo
                left = _leftover(u, pe, cdf, lab, v, redrawn, ra, rk, rj)
                c, left = _draw(pe[ra, rj] * ~closed[ra, rk], left)
                lab[ra, rk, rj] = c
                v[ra, rk, rj] = left
                redrawn[ra, rk, rj] = True
        start = np.where(filled, hit + 1, n)
        todo = start < n
    if order is not None:
        res = np.empty_like(lab)
        np.put_along_axis(res, np.broadcast_to(order[:, None, :], lab.shape), lab, axis=2)
        lab = res
    return lab


def sample_labels(p: np.ndarray, weights: np.ndarray, cap: float, n_samples: int,
                  rng: np.random.Generator, order: np.ndarray | None = None) -> np.ndarray:
    """int64[K, n]: `sample_batch` for one problem, p float[n, E]; order None draws a random
    visiting order (pass np.arange(n) for line 9's)."""
    n = p.shape[0]
    if order is None:
        order = rng.permutation(n)
    return sample_batch(p[None], np.asarray(weights)[None], np.array([cap]), n_samples, rng,
                        np.asarray(order)[None])[0].astype(np.int64)
