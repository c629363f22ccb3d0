"""Per-batch expert load and its long tail (FSE-DP §II, Fig. 2(b, c)).

Tokens are cut, in trace order, into consecutive batches of B tokens (B = 16, 64, 256, 1024, as
FSE-DP profiles). For each batch and layer we count the tokens each expert receives and sort the
counts in decreasing order; the reported curve is the mean sorted curve over batches and layers.
Figures per B: mean over (batch, layer) of max/mean load, share of experts that get no token,
share of the selections that land on the hottest 10% of experts, and share of the activated
experts that get a single token (the "cold" experts whose weights are fetched for one token).
"""

from __future__ import annotations

import numpy as np

BATCH_SIZES = (16, 64, 256, 1024)


def batch_load(experts: np.ndarray, num_experts: int, batch: int,
               max_batches: int = 256) -> np.ndarray:
    """int32[batches, L, N]: per batch of `batch` consecutive tokens, tokens per expert.

    experts: int[T, L, k]. At most `max_batches` full batches, spread evenly over the trace.
    """
    T, L, k = experts.shape
    n_full = T // batch
    if n_full == 0:
        return np.zeros((0, L, num_experts), np.int32)
    picks = np.unique(np.linspace(0, n_full - 1, min(n_full, max_batches)).astype(np.int64))
    rows = (picks[:, None] * batch + np.arange(batch)[None, :]).ravel()
    b = np.repeat(np.arange(picks.size), batch)
    key = ((b[:, None, None] * L + np.arange(L)[None, :, None]) * num_experts
           + experts[rows].astype(np.int64))
    counts = np.bincount(key.ravel(), minlength=picks.size * L * num_experts)
    return counts.reshape(picks.size, L, num_experts).astype(np.int32)


def long_tail(experts: np.ndarray, num_experts: int,
              batch_sizes: tuple[int, ...] = BATCH_SIZES) -> dict[int, dict]:
    """{B: {"sorted_load": float[N] mean sorted counts, "max_over_mean", "zero_share",
    "top10_share", "single_token_share", "batches"}} for each batch size with a full batch."""
    out: dict[int, dict] = {}
    for B in batch_sizes:
        counts = batch_load(experts, num_experts, B)
        if counts.shape[0] == 0:
            continue
        flat = counts.reshape(-1, num_experts).astype(np.float64)
        srt = -np.sort(-flat, axis=1)
        mean = flat.mean(axis=1)
        n_top = max(1, int(round(0.1 * num_experts)))
        active = (flat > 0).sum(axis=1)
        out[B] = {
            "batches": int(counts.shape[0]),
            "sorted_load": srt.mean(axis=0).tolist(),
            "max_over_mean": float((srt[:, 0] / mean).mean()),
            "zero_share": float((flat == 0).mean()),
            "top10_share": float((srt[:, :n_top].sum(axis=1) / flat.sum(axis=1)).mean()),
            "single_token_share": float(((flat == 1).sum(axis=1) / np.maximum(active, 1)).mean()),
        }
    return out
