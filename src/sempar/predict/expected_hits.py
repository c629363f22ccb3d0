"""`ExpectedHits`: a per-device score for each (token, layer) instead of one predicted device (ours).

Sem-MoE's T and A predict one device per token; the align step can then only guess where a
token goes when that device is full. Here each (token, layer) gets the expected number of its
experts every device hosts, from two fitted distributions:

    P_tok[l, u, e]  = share of token u's fit activations at layer l on expert e (Sem-MoE's Cp)
    P_prev[l, e', e] = P(expert e at layer l | expert e' selected at layer l - 1), counted over
                       the fit trace's (e', e) pairs (ExFlow §III's inter-layer affinity)
    score[t, l, g] = k * sum_e hosts[l, g, e] * (a P_tok[l, u_t, e]
                                                 + (1 - a) mean_{e' in E_t(l-1)} P_prev[l, e', e])

E_t(l - 1) are the token's REAL experts at the previous layer: in the pipelined flow they are
known when layer l's home is chosen (the router of layer l - 1 has run). Layer 0 and tokens the
token table does not know (after OOV mapping) use what they have. Both factors are folded into
the placement once at fit time (`[U, G]` and `[N, G]` per layer), so prediction costs a lookup
and k adds per (token, layer).

The home rule then is the capacity-bound oracle's (`schedule.rebatch.propose`) on the scores:
a token asks its best device first, a full device keeps its tokens with the highest expected
hits, and a spilled token asks its own next-best device.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from sempar.affinity.affinity_stats import layer_counts
from sempar.predict.device_state import fit_inputs
from sempar.predict.oov import EmbeddingOOV, fitted_mapper
from sempar.trace.schema import RoutingTrace

ALPHA = 0.5      # weight of the token table against the previous layer (tiny-moe64, EP 8: 0.3-0.5 best)


class ExpectedHits:
    """Fitted per-device expected hits. Learned: `tokens_` int64[U], `tok_dev_` float32[L, U, G],
    `prev_dev_` float32[L, N, G] (layer 0 unused), `oov_`."""

    def __init__(self, oov: EmbeddingOOV | None = None, alpha: float = ALPHA):
        self.oov, self.alpha = oov, alpha

    def fit(self, trace: RoutingTrace, placement) -> "ExpectedHits":
        hosts, tokens, tok = fit_inputs(trace, placement)
        L, G, N = hosts.shape
        k = trace.meta.top_k
        U = tokens.size
        tok_dev = np.zeros((L, U, G), np.float32)
        prev_dev = np.zeros((L, N, G), np.float32)
        for l in range(L):
            h = hosts[l].T.astype(np.float64)                                # [N, G]
            row, expert, count = layer_counts(tok, trace.experts[:, l], N)
            C = sparse.csr_array((count.astype(np.float64), (row, expert)), shape=(U, N))
            tok_dev[l] = (C @ h) / np.maximum(C.sum(axis=1), 1)[:, None]
            if l:
                src = np.repeat(trace.experts[:, l - 1].astype(np.int64), k, axis=1).ravel()
                dst = np.tile(trace.experts[:, l].astype(np.int64), (1, k)).ravel()
                M = np.bincount(src * N + dst, minlength=N * N).reshape(N, N).astype(np.float64)
                prev_dev[l] = (M @ h) / np.maximum(M.sum(axis=1), 1)[:, None]
        self.tokens_, self.tok_dev_, self.prev_dev_ = tokens, tok_dev, prev_dev
        self.top_k_ = k
        self.oov_ = fitted_mapper(self.oov, tokens)
        return self

    def scores(self, trace: RoutingTrace) -> np.ndarray:
        """float32[T, L, G]: expected local activations per device (up to k)."""
        ids = np.asarray(trace.token_id, np.int64)
        if self.oov_ is not None:
            ids = self.oov_.map(ids)
        pos = np.minimum(np.searchsorted(self.tokens_, ids), self.tokens_.size - 1)
        seen = self.tokens_[pos] == ids
        L, _, G = self.tok_dev_.shape
        k = self.top_k_
        out = np.empty((ids.size, L, G), np.float32)
        for l in range(L):
            tok = np.where(seen[:, None], self.tok_dev_[l][pos], 0.0)
            if l == 0:
                out[:, l] = k * tok
                continue
            prev = self.prev_dev_[l][trace.experts[:, l - 1].astype(np.int64)].mean(axis=1)
            a = np.where(seen, self.alpha, 0.0)[:, None]
            out[:, l] = k * (a * tok + (1 - a) * prev)
        return out
