"""`DeviceNgram`: the device-sequence n-gram tables A / Ap (Sem-MoE App. B.1, s-MoE App. B.1).

Both papers model Pr(D^(l) | D^(l-1), ..., D^(l-n)) over *device* states (not experts: only the
device-level re-batching matters) and tabulate, for the Q^n sequences of previous devices, the
most likely next device A = argmax(Ap, axis=1) and its confidence Ap; "we use 2-gram in
practice" (look-back n = 2). Sem-MoE Alg. 3 then sends a token by A when Ap beats the token
table's Tp.

Our choices where the papers are open:

- The device state of a (token, layer) is the device hosting most of its real selected experts
  under the placement, ties to the lowest device id (`device_state.py`).
- One table per layer: device ids mean different expert sets at different layers. A_[l][m] is
  the table of look-back m <= min(n, l), indexed by the context code
  sum_i s[l-m+i] * G^(m-1-i) (oldest state most significant): int16[G^m] device, -1 for a
  context never seen in the fit trace, and Ap_[l][m] float32[G^m] the empirical frequency of
  that device after the context. Ties in the counts go to the lowest device id.
- Back-off: a context never seen at look-back m falls back to its suffix of length m-1, ...,
  down to m = 0, the layer's marginal (the most common state at l); the confidence is that of
  the table used, i.e. the frequency measured for the context that decided. Layers l < n use
  look-back l (layer 0 only has its marginal). A previous state of -1 (unknown) cuts the
  context at that point.
- Dense tables, as the papers' [Q^n, Q] layout; `nbytes` counts the int16 device ids A and the
  float16 confidences Ap as served (float32 in memory), summed over every layer and look-back
  level kept for back-off (about L * G^n entries each).
"""

from __future__ import annotations

import numpy as np

from sempar.errors import InputError
from sempar.affinity.affinity_stats import device_states
from sempar.predict.device_state import check_placement
from sempar.trace.schema import RoutingTrace

MAX_CONTEXTS = 1 << 24    # dense G^n rows per table; beyond that the look-back is too long


class DeviceNgram:
    """Device-sequence n-gram predictor A / Ap with back-off (Sem-MoE B.1, s-MoE B.1).

    Parameters: `n` look-back (previous layers used, default 2 as in both papers).
    Learned: `A_[l][m]` int16[G^m], `Ap_[l][m]` float32[G^m] for layer l and look-back
    m = 0..min(n, l); `hosts_` bool[L, G, N] the placement's hosting; `num_devices_`.
    """

    def __init__(self, n: int = 2):
        self.n = n

    def fit(self, trace: RoutingTrace, placement) -> "DeviceNgram":
        """placement: a `Placement` (anything with `hosts() -> bool[L, G, N]`)."""
        if not isinstance(self.n, (int, np.integer)) or self.n < 0:
            raise InputError(f"n: look-back {self.n!r} is not a non-negative integer")
        hosts = placement.hosts()
        check_placement(trace, hosts)
        L, G, _ = hosts.shape
        if G ** self.n > MAX_CONTEXTS:
            raise InputError(f"n: look-back {self.n} over {G} devices needs {G ** self.n} "
                             f"contexts per layer (at most {MAX_CONTEXTS})")
        if trace.num_tokens == 0:
            raise InputError("trace: no tokens to fit the n-gram table on")
        states = device_states(trace.experts, hosts).astype(np.int64)
        self.A_, self.Ap_ = [], []
        for l in range(L):
            A_l, Ap_l = [], []
            for m in range(min(self.n, l) + 1):
                code = _context_code(states[:, l - m:l], G)
                A, Ap = _table(code, states[:, l], G ** m, G)
                A_l.append(A)
                Ap_l.append(Ap)
            self.A_.append(A_l)
            self.Ap_.append(Ap_l)
        self.hosts_ = hosts
        self.num_devices_ = G
        return self

    def predict(self, prev_states: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(device int16[T], confidence float32[T]) at `layer` after the given previous states.

        prev_states: int[T, j] the token's device states at layers layer-j..layer-1 (oldest
        first; j may differ from n: the last min(n, layer, j) columns are used); -1 = unknown.
        Unseen contexts back off to shorter ones (module docstring).
        """
        if not 0 <= layer < len(self.A_):
            raise InputError(f"layer: {layer} is not in [0, {len(self.A_)})")
        prev = np.asarray(prev_states, np.int64)
        if prev.ndim == 1:
            prev = prev[:, None]
        G = self.num_devices_
        if (prev >= G).any():
            raise InputError(f"prev_states: device {int(prev.max())} is not in [0, {G})")
        m_max = min(self.n, layer, prev.shape[1])
        prev = prev[:, prev.shape[1] - m_max:]
        # Longest run of known (>= 0) states ending at the newest column.
        known = np.cumprod((prev >= 0)[:, ::-1], axis=1).sum(axis=1) if m_max else \
            np.zeros(prev.shape[0], np.int64)
        device = np.full(prev.shape[0], self.A_[layer][0][0], np.int16)
        conf = np.full(prev.shape[0], self.Ap_[layer][0][0], np.float32)
        for m in range(1, m_max + 1):
            ok = known >= m
            code = _context_code(np.where(ok[:, None], prev[:, m_max - m:], 0), G)
            seen = ok & (self.A_[layer][m][code] >= 0)
            device[seen] = self.A_[layer][m][code[seen]]
            conf[seen] = self.Ap_[layer][m][code[seen]]
        return device, conf

    def predict_states(self, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(device int16[T, L], confidence float32[T, L]) from the real states int[T, L].

        Layer l uses states at layers l-n..l-1 (fewer for l < n): in the pipelined flow they are
        known when layer l's router runs.
        """
        T, L = states.shape
        device = np.empty((T, L), np.int16)
        conf = np.empty((T, L), np.float32)
        for l in range(L):
            device[:, l], conf[:, l] = self.predict(states[:, max(0, l - self.n):l], l)
        return device, conf

    def predict_trace(self, trace: RoutingTrace) -> tuple[np.ndarray, np.ndarray]:
        """(device int16[T, L], confidence float32[T, L]) for every token and layer of `trace`,
        from its real device states under the fitted placement."""
        check_placement(trace, self.hosts_)
        return self.predict_states(device_states(trace.experts, self.hosts_))

    def nbytes(self) -> dict[str, int]:
        """Bytes as served: int16 device ids (A) and float16 confidences (Ap), all tables."""
        entries = sum(a.size for A_l in self.A_ for a in A_l)
        return {"device": 2 * entries, "confidence": 2 * entries}


def _context_code(ctx: np.ndarray, G: int) -> np.ndarray:
    """int64[T]: base-G code of each row of ctx int[T, m] (oldest state most significant)."""
    code = np.zeros(ctx.shape[0], np.int64)
    for j in range(ctx.shape[1]):
        code = code * G + ctx[:, j]
    return code


def _table(code: np.ndarray, nxt: np.ndarray, n_ctx: int, G: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """(A int16[n_ctx], Ap float32[n_ctx]): most frequent next state per context, its frequency."""
    uniq, count = np.unique(code * G + nxt, return_counts=True)
    ctx, dev = uniq // G, uniq % G
    order = np.lexsort((dev, -count, ctx))        # per context: most frequent, then lowest id
    ctx, dev, count = ctx[order], dev[order], count[order]
    first = np.r_[True, ctx[1:] != ctx[:-1]]
    totals = np.add.reduceat(count, np.flatnonzero(first))
    A = np.full(n_ctx, -1, np.int16)
    Ap = np.zeros(n_ctx, np.float32)
    A[ctx[first]] = dev[first]
    Ap[ctx[first]] = count[first] / totals
    return A, Ap
