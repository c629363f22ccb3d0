"""`TokenDevice`: the token -> device table T and its confidence Tp for any placement (Sem-MoE §3.2).

The co-clustering solvers (semmoe, smoe-cem, metis, kmeans2d) return their own table
(`placement.token_table`); `TokenDevice` computes one for *any* placement (vanilla, eplb, ...)
from a fit trace, the way `placement.base.coclustered_placement` does for semmoe:

    share[l, u, g] = sum_e Cp[l, u, e] * hosts[l, g, e]        (expected activations on g)
    T[l, u]  = argmax_g share[l, u, g]      (ties: lowest device id)
    Tp[l, u] = share[l, u, T[l, u]]         in [0, 1]

`confidence="state"` replaces Tp by the share of the token's fit occurrences whose device state
(`device_state.py`) was T[l, u]: the same kind of figure as the n-gram table's Ap, so that
Sem-MoE Alg. 3's `Tp > Ap` test compares like with like (the activation share is lower than the
probability of being the state: a token that always sends 4 of its 8 experts to device g has
Tp = 0.5 under "share" and 1.0 under "state").

With replicas an expert counts for every device that hosts it (an activation is local on any of
them), so shares may then sum to more than 1 over devices. Shares are computed from integer
counts, so ties are exact (the float Cp of the solvers can break an exact tie either way).

Unseen tokens go through the optional OOV mapper (`oov.py`); unmapped ones get device -1 and
confidence -1 (`TokenTable.lookup`'s convention: the re-batcher fills devices with them).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from sempar.errors import InputError
from sempar.affinity.affinity_stats import device_states, layer_counts
from sempar.predict.device_state import fit_inputs
from sempar.predict.oov import EmbeddingOOV, fitted_mapper
from sempar.predict.token_table import TokenTable
from sempar.trace.schema import RoutingTrace, require_token_ids

CONFIDENCES = ("share", "state")


class TokenDevice:
    """Token -> device table T / Tp for a placement (Sem-MoE §3.2), fitted on a routing trace.

    Parameters: `oov` maps unseen token ids to known ones (fitted to the table's tokens);
    `confidence`: "share" (Tp = activation share, the paper's, default) or "state" (module
    docstring).
    Learned: `table_` TokenTable (token_id int64[U], device int16[L, U], confidence
    float32[L, U]); `num_devices_`; `oov_` the fitted mapper or None.
    """

    def __init__(self, oov: EmbeddingOOV | None = None, confidence: str = "share"):
        self.oov = oov
        self.confidence = confidence

    def fit(self, trace: RoutingTrace, placement) -> "TokenDevice":
        """placement: a `Placement` (anything with `hosts() -> bool[L, G, N]`)."""
        if self.confidence not in CONFIDENCES:
            raise InputError(f"confidence: {self.confidence!r} is not one of {', '.join(CONFIDENCES)}")
        require_token_ids(trace.meta, "the token table T")
        hosts, tokens, tok = fit_inputs(trace, placement)
        L, G, N = hosts.shape
        k = trace.meta.top_k
        U = tokens.size
        total = k * np.bincount(tok, minlength=U)
        device = np.zeros((L, U), np.int16)
        conf = np.zeros((L, U), np.float32)
        for l in range(L):
            row, expert, count = layer_counts(tok, trace.experts[:, l], N)
            C = sparse.csr_array((count, (row, expert)), shape=(U, N))
            share = C @ hosts[l].T.astype(np.int64)                    # int64[U, G], exact
            best = share.argmax(axis=1)
            device[l] = best
            conf[l] = share[np.arange(U), best] / np.maximum(total, 1)
        if self.confidence == "state":
            hit = device_states(trace.experts, hosts) == device[:, tok].T          # bool[T, L]
            occurrences = np.maximum(np.bincount(tok, minlength=U), 1)
            for l in range(L):
                conf[l] = np.bincount(tok, weights=hit[:, l], minlength=U) / occurrences
        self.table_ = TokenTable(tokens, device, conf)
        self.num_devices_ = G
        self.oov_ = fitted_mapper(self.oov, tokens)
        return self

    @classmethod
    def from_table(cls, table: TokenTable, num_devices: int,
                   oov: EmbeddingOOV | None = None) -> "TokenDevice":
        """Wrap an existing table (e.g. `placement.token_table`), adding OOV mapping to it."""
        self = cls(oov)      # confidence: whatever the table holds
        self.table_ = TokenTable.from_json(table)
        self.num_devices_ = num_devices
        self.oov_ = fitted_mapper(oov, self.table_.token_id)
        return self

    def predict(self, token_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(device int16[T, L], confidence float32[T, L]); -1 / -1 for unknown tokens."""
        ids = np.asarray(token_id, np.int64)
        if self.oov_ is not None:
            ids = self.oov_.map(ids)
        return self.table_.lookup(ids)

    def nbytes(self) -> dict[str, int]:
        """The table's bytes as served: int16 devices (2 L U), float16 confidences, token ids."""
        return self.table_.nbytes()
