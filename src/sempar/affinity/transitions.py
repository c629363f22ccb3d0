"""Inter-layer affinity: P(E_{l+1} | E_l) and look-back prediction (Sem-MoE A.2, Fig. 6(c); ExFlow §III).

Definitions (our choices where the papers are open):

- A token's **state** at layer l is its top-1 expert (slot 0: the trace lists experts by
  decreasing router weight). At **device level** the state is the device hosting most of its k
  experts under the contiguous layout of N experts on G devices (what engines do by default),
  ties going to the device of the highest-ranked expert (`affinity_stats.device_states`,
  ties="top1").
- **Look-back prediction with n layers** (Sem-MoE B.1 builds the same table over device
  sequences): fit on the fit rows a table context -> counts of the items selected at layer l,
  where the context is the token's states at layers l-n..l-1; predict the k most frequent items
  (expert level: the k experts of the top-k; device level: the single state). A context never
  seen in the fit rows backs off to the longest seen suffix (n-1, ..., 0 = the layer's marginal).
  Accuracy of a scored row = |predicted ∩ actual| / k. Layers l >= `max_lookback` are scored, so
  every n is measured on the same targets.
- **Conditional probability** P(E_{l+1} = j | E_l = i): over all k x k pairs of a token's
  selections at the two layers, row-normalised. Its **top-k mass** is the share of each row's
  traffic that its k largest entries hold, averaged with the rows' traffic as weights: 1 when a layer's choice fixes the
  next layer's, k/N for independent uniform routing.
"""

from __future__ import annotations

import numpy as np


def contiguous_devices(num_experts: int, num_devices: int) -> np.ndarray:
    """int64[N]: device of each expert when N experts are laid out contiguously on G devices."""
    return np.arange(num_experts, dtype=np.int64) * num_devices // num_experts


def _compact(keys: np.ndarray) -> np.ndarray:
    return np.unique(keys, return_inverse=True)[1].astype(np.int64)


def _bitsets(items: np.ndarray, n_items: int) -> np.ndarray:
    """uint64[rows, ceil(n_items / 64)]: each row's set of items as a bit set (-1 = no item)."""
    words = (n_items + 63) // 64
    word = items // 64
    bit = np.left_shift(np.uint64(1), (items % 64).astype(np.uint64))
    out = np.zeros((items.shape[0], words), np.uint64)
    for w in range(words):
        out[:, w] = np.bitwise_or.reduce(np.where((word == w) & (items >= 0), bit, np.uint64(0)),
                                         axis=1)
    return out


def _predicted_items(ctx: np.ndarray, items: np.ndarray, n_ctx: int, n_items: int,
                     k: int) -> np.ndarray:
    """int64[n_ctx, k]: each context's k most frequent items (ties to the lower id), -1 padded.

    ctx: int64[rows] compact context ids < n_ctx; items: int[rows, k_items] the fit rows' targets.
    """
    keys = (ctx[:, None] * n_items + items).ravel()
    uniq, count = np.unique(keys, return_counts=True)
    c, it = uniq // n_items, uniq % n_items
    order = np.lexsort((it, -count, c))
    c, it = c[order], it[order]
    rank = np.arange(c.size) - np.searchsorted(c, c, side="left")
    keep = rank < k
    table = np.full((n_ctx, k), -1, np.int64)
    table[c[keep], rank[keep]] = it[keep]
    return table


def lookback_accuracy(states: np.ndarray, targets: np.ndarray, n_items: int, fit: np.ndarray,
                      max_lookback: int = 5) -> list[float | None]:
    """Mean accuracy of look-back n = 1..max_lookback over scored layers (see module docstring).

    states: int[T, L] context states; targets: int[T, L, kt] items to predict at each layer
    (kt = k experts, or 1 device); n_items: size of the items' alphabet; fit: bool[T].
    """
    T, L = states.shape
    kt = targets.shape[2]
    first = min(max_lookback, L - 1)
    if first < 1 or not fit.any() or fit.all():
        return [None] * max_lookback
    score = ~fit
    hits = np.zeros(max_lookback)
    S = int(states.max()) + 1
    for l in range(first, L):
        actual = _bitsets(targets[score, l].astype(np.int64), n_items)
        ctx = np.zeros(T, np.int64)                 # n = 0: one context, the layer marginal
        seen_at, acc_at = [], []                    # per look-back level m
        for m in range(0, min(max_lookback, l) + 1):
            if m:
                ctx = _compact(ctx * S + states[:, l - m])
            pred = _predicted_items(ctx[fit], targets[fit, l], T, n_items, kt)
            c = ctx[score]
            seen = pred[:, 0] >= 0
            seen_at.append(seen[c])
            pred_bits = _bitsets(pred[seen], n_items)       # only contexts seen in the fit rows
            slot = np.cumsum(seen) - 1
            hit_bits = np.bitwise_count(pred_bits[slot[c]] & actual).sum(axis=1)
            acc_at.append(hit_bits / kt)
        for n in range(1, max_lookback + 1):
            # Back off from n to the longest context seen in the fit rows (m = 0 always is).
            got = acc_at[0].copy()
            done = np.zeros(got.size, bool)
            for m in range(min(n, len(acc_at) - 1), 0, -1):
                use = seen_at[m] & ~done
                got[use] = acc_at[m][use]
                done |= use
            hits[n - 1] += got.mean()
    return [float(h / (L - first)) for h in hits]


def transition_matrix(a: np.ndarray, b: np.ndarray, n_items: int) -> np.ndarray:
    """float64[n, n]: P(item at layer b | item at layer a) over all pairs of selections.

    a, b: int[T, k] selections of the same tokens at two layers. Rows with no traffic are zero.
    """
    counts = pair_counts(a, b, n_items).astype(float)
    total = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)


def topk_mass(counts_or_probs: np.ndarray, k: int, row_weight: np.ndarray | None = None) -> float:
    """Traffic-weighted mean over rows of (mass of the k largest entries) / (row sum)."""
    P = counts_or_probs.astype(float)
    total = P.sum(axis=1)
    keep = total > 0
    if not keep.any():
        return float("nan")
    top = -np.partition(-P[keep], min(k, P.shape[1]) - 1, axis=1)[:, :k].sum(axis=1)
    w = total[keep] if row_weight is None else row_weight[keep]
    return float(np.average(top / total[keep], weights=w))


def pair_counts(a: np.ndarray, b: np.ndarray, n_items: int) -> np.ndarray:
    """int64[n, n]: counts of (item at layer a, item at layer b) over all pairs of selections."""
    key = (a[:, :, None].astype(np.int64) * n_items + b[:, None, :]).ravel()
    return np.bincount(key, minlength=n_items * n_items).reshape(n_items, n_items)
