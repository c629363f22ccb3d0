"""`ExpertConfidence`: the token -> expert confidence table Cp (Sem-MoE §3.2).

Sem-MoE §3.2 counts, per MoE layer l, how often token x_j activated expert E_k in the profile
(the token-to-expert activation table T^(l) in N^{t x N}) and tabulates
    Cp[l, j, k] = Pr(E_k | x_j) = T[l, j, k] / sum_k' T[l, j, k'].
Every occurrence selects k distinct experts, so a row sums to 1 and Cp[l, j, e] is also the
share of x_j's occurrences whose top-k held e, divided by k.

Storage: a dense float32[L, U, N] is 6 GB for U = 100k, N = 256, L = 58, yet a row has at most
min(N, k * occurrences) non-zeros, so Cp is kept as CSR with each row's entries sorted by
decreasing probability (ties: lower expert id first). Then the top-k of a row is its first k
entries, and `max_entries` (optional) keeps only the m most likely experts per row: rows then
sum to <= 1 (they are not renormalised: the dropped mass is the probability of an expert
outside the stored ones). The arrays:
    indptr_ int64[L, U + 1]: row (l, u) is entries [indptr_[l, u], indptr_[l, u + 1]) of
    expert_ int16[nnz] (int32 when N > 32767) and proba_ float32[nnz].
Bytes: 6 per stored entry plus 8 per row (`nbytes`).

Unseen tokens go through the optional OOV mapper (`oov.py`); without one, or when it cannot map
a token, the token has no prediction: an all-zero probability row and experts -1.
"""

from __future__ import annotations

import numpy as np

from sempar.affinity.affinity_stats import layer_counts
from sempar.errors import InputError
from sempar.predict.oov import EmbeddingOOV, fitted_mapper, resolve
from sempar.trace.schema import RoutingTrace


class ExpertConfidence:
    """Token -> expert confidence Cp per layer (Sem-MoE §3.2), fitted on a routing trace.

    Parameters: `max_entries` (None = every non-zero) bounds the stored experts per row;
    `oov` maps unseen token ids to known ones (fitted to this table's tokens by `fit`).
    Learned: `tokens_` int64[U] sorted fit token ids; `indptr_`, `expert_`, `proba_` (the CSR
    table, module docstring); `num_experts_`, `top_k_`; `oov_` the fitted mapper or None.
    """

    def __init__(self, max_entries: int | None = None, oov: EmbeddingOOV | None = None):
        self.max_entries = max_entries
        self.oov = oov

    def fit(self, trace: RoutingTrace) -> "ExpertConfidence":
        if self.max_entries is not None and self.max_entries < 1:
            raise InputError(f"max_entries: {self.max_entries} is not a positive integer")
        meta = trace.meta
        L, N, k = meta.num_layers, meta.num_experts, meta.top_k
        tokens, tok = np.unique(np.asarray(trace.token_id, np.int64), return_inverse=True)
        U = tokens.size
        occurrences = np.bincount(tok, minlength=U)
        indptr = np.zeros((L, U + 1), np.int64)
        experts, probas = [], []
        offset = 0
        for l in range(L):
            row, expert, count = layer_counts(tok, trace.experts[:, l], N)
            if self.max_entries is not None:
                rank = np.arange(row.size) - np.searchsorted(row, row, side="left")
                keep = rank < self.max_entries
                row, expert, count = row[keep], expert[keep], count[keep]
            indptr[l, 1:] = offset + np.cumsum(np.bincount(row, minlength=U))
            indptr[l, 0] = offset
            offset += row.size
            experts.append(expert.astype(meta.stored_dtype))
            probas.append((count / (k * occurrences[row])).astype(np.float32))
        self.tokens_ = tokens
        self.indptr_ = indptr
        self.expert_ = np.concatenate(experts) if experts else np.zeros(0, meta.stored_dtype)
        self.proba_ = np.concatenate(probas) if probas else np.zeros(0, np.float32)
        self.num_experts_, self.top_k_, self.num_layers_ = N, k, L
        self.oov_ = fitted_mapper(self.oov, tokens)
        return self

    def _rows(self, token_id: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(start int64[T], length int64[T]) of each token's CSR row; length 0 when unknown."""
        if not 0 <= layer < self.num_layers_:
            raise InputError(f"layer: {layer} is not in [0, {self.num_layers_})")
        pos, seen = resolve(self.tokens_, token_id, self.oov_)
        start = self.indptr_[layer, pos]
        length = np.where(seen, self.indptr_[layer, pos + 1] - start, 0)
        return start, length

    def predict_proba(self, token_id: np.ndarray, layer: int) -> np.ndarray:
        """float32[T, N]: Cp[layer] rows of the tokens (all zeros when a token is unknown)."""
        start, length = self._rows(token_id, layer)
        out = np.zeros((start.size, self.num_experts_), np.float32)
        t = np.repeat(np.arange(start.size), length)
        idx = np.repeat(start - np.cumsum(length) + length, length) + np.arange(length.sum())
        out[t, self.expert_[idx]] = self.proba_[idx]
        return out

    def predict(self, token_id: np.ndarray, layer: int, k: int | None = None) -> np.ndarray:
        """int64[T, k]: the k most likely experts of each token (ties: lower id), -1 padded.

        k defaults to the trace's top-k. A row shorter than k (an unknown token, or `max_entries`
        < k) is padded with -1.
        """
        k = self.top_k_ if k is None else int(k)
        start, length = self._rows(token_id, layer)
        j = np.arange(k)
        inside = j[None, :] < length[:, None]
        idx = np.where(inside, start[:, None] + j[None, :], 0)
        return np.where(inside, self.expert_[idx] if self.expert_.size else -1, -1).astype(np.int64)

    def accuracy(self, trace: RoutingTrace, seen_only: bool = False) -> np.ndarray:
        """float64[L]: per-layer top-k recall |predicted top-k ∩ real top-k| / k.

        Averaged over every token of `trace` (unknown tokens score 0), or with `seen_only` over
        the tokens that have a prediction (NaN for a layer with none).
        """
        T, L, k = trace.experts.shape
        out = np.full(L, np.nan)
        for l in range(L):
            pred = self.predict(trace.token_id, l, k)
            real = trace.experts[:, l].astype(np.int64)
            hits = (pred[:, :, None] == real[:, None, :]).any(axis=2).sum(axis=1) / k
            rows = pred[:, 0] >= 0 if seen_only else np.ones(T, bool)
            if rows.any():
                out[l] = hits[rows].mean()
        return out

    def nbytes(self) -> dict[str, int]:
        """Bytes of the stored table: expert ids, float32 probabilities, row pointers."""
        return {"expert": int(self.expert_.nbytes), "proba": int(self.proba_.nbytes),
                "indptr": int(self.indptr_.nbytes), "token_id": int(self.tokens_.nbytes)}
