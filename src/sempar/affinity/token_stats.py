"""Token -> expert concentration: Sem-MoE Table 1 and the kurtosis of Sem-MoE A.2 / Fig. 6(b).

Definitions (Sem-MoE §3.2 leaves the details open; these are our choices):

- A token's **activation map** at layer l is the count vector c[v, :] over the N routed experts of
  how often token id v selected each expert in its top-k. Its **hotness** is c / c.sum(), i.e.
  Pr(E | v) of §3.2, so the hotness of a token that always routes to the same k experts sums to 1
  over those k.
- **Cumulative hotness of the top-k**: the sum of the k largest hotness values; **max hotness of the
  non-top-k**: the (k+1)-th largest. Quantiles are over token ids with at least `min_occurrences`
  occurrences (a token seen once has a trivial map).
- **F1 of the static top-k** (A.2): per token id, the k experts it selected most often in the fit
  part (a seeded random 25% of the rows); every occurrence in the other 75% whose token id was seen
  in the fit part is scored by |static ∩ actual| / k, which equals precision, recall and F1 since
  both sets have k members. Quantiles are over the scored occurrences, which is why Table 1's
  figures are multiples of 1/k. Ties in the counts go to the lower expert id.
- **Kurtosis** (Pearson, not excess) of each token's activation map over the N experts, for tokens
  with at least `min_occurrences` occurrences: a token that always routes to the same k of N experts
  has (1 - 3p(1-p)) / (p(1-p)) with p = k / N (8.8 for 6 of 64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sempar.affinity.affinity_stats import activation_counts

QUANTILES = (25, 50, 75)


def quantiles(x: np.ndarray) -> dict[str, float | None]:
    """{"p25", "p50", "p75"} of x (None when x is empty)."""
    if x.size == 0:
        return {f"p{q}": None for q in QUANTILES}
    vals = np.percentile(x, QUANTILES)
    return {f"p{q}": float(v) for q, v in zip(QUANTILES, vals)}


def top_k_mask(counts: np.ndarray, k: int) -> np.ndarray:
    """bool[n, N]: each row's k largest counts (ties to the lower expert id)."""
    n, N = counts.shape
    if k >= N:
        return np.ones((n, N), bool)
    # Unique keys: equal counts rank by ascending expert id.
    key = counts.astype(np.int64) * N + (N - 1 - np.arange(N))
    top = np.argpartition(-key, k - 1, axis=1)[:, :k]
    mask = np.zeros((n, N), bool)
    np.put_along_axis(mask, top, True, axis=1)
    return mask


def hotness_stats(counts: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(cum hotness of top-k float64[n], max hotness of non-top-k float64[n]) per token row."""
    total = counts.sum(axis=1).astype(np.float64)
    if counts.shape[1] > k:
        part = -np.partition(-counts, k, axis=1)[:, : k + 1]
        part = -np.sort(-part, axis=1)
        return part[:, :k].sum(axis=1) / total, part[:, k] / total
    return np.ones_like(total), np.zeros_like(total)


def pearson_kurtosis(counts: np.ndarray) -> np.ndarray:
    """float64[n]: Pearson kurtosis of each row (NaN for constant rows)."""
    x = counts.astype(np.float64)
    d = x - x.mean(axis=1, keepdims=True)
    d *= d  # float power is slow: square twice
    m2 = d.mean(axis=1)
    m4 = (d * d).mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return m4 / m2**2


@dataclass
class LayerTable1:
    """Table-1 figures of one layer: distributions whose quantiles are reported."""

    f1: np.ndarray                  # float64[scored occurrences]
    cum_hotness_topk: np.ndarray    # float64[tokens with >= min_occurrences]
    max_hotness_non_topk: np.ndarray
    kurtosis: np.ndarray

    def summary(self, layer: int) -> dict:
        kurt = self.kurtosis[np.isfinite(self.kurtosis)]
        return {"layer": layer, "f1": quantiles(self.f1),
                "cum_hotness_topk": quantiles(self.cum_hotness_topk),
                "max_hotness_non_topk": quantiles(self.max_hotness_non_topk),
                "kurtosis_p50": float(np.median(kurt)) if kurt.size else None,
                "f1_mean": float(self.f1.mean()) if self.f1.size else None,
                "scored_occurrences": int(self.f1.size),
                "tokens": int(self.cum_hotness_topk.size)}


def table1_layer(token_index: np.ndarray, experts: np.ndarray, fit: np.ndarray, n_tokens: int,
                 num_experts: int, min_occurrences: int = 2) -> LayerTable1:
    """Sem-MoE Table 1 for one layer.

    token_index: int[T] compact token indices; experts: int[T, k]; fit: bool[T] rows that fit the
    static top-k (the others are scored).
    """
    k = experts.shape[1]
    fit_counts = activation_counts(token_index[fit], experts[fit], n_tokens, num_experts)
    seen = fit_counts.sum(axis=1) > 0
    static = np.zeros_like(fit_counts, dtype=bool)
    static[seen] = top_k_mask(fit_counts[seen], k)
    score_rows = ~fit & seen[token_index]
    tok = token_index[score_rows]
    hits = static[tok[:, None], experts[score_rows]].sum(axis=1)
    f1 = hits / k

    counts = activation_counts(token_index, experts, n_tokens, num_experts)
    enough = counts.sum(axis=1) >= min_occurrences * k
    cum, mx = hotness_stats(counts[enough], k)
    return LayerTable1(f1=f1, cum_hotness_topk=cum, max_hotness_non_topk=mx,
                       kurtosis=pearson_kurtosis(counts[enough]))
