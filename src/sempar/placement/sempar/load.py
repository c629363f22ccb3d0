"""Device loads of the `sempar` solver: the fit load plus a robust margin for the spread a
placement adds (`LoadModel`), shared by its default and large-trace paths.

Shapes: N experts, G devices, R fit requests; `dev` int[N] is each expert's device.
"""

from __future__ import annotations

import numpy as np

from sempar.affinity.affinity_stats import AffinityStats
from sempar.affinity.requests import request_counts


def load_spread(X: np.ndarray, load: np.ndarray, gram: np.ndarray | None = None) -> np.ndarray:
    """float64[N, N]: Sigma with 1_S^T Sigma 1_S = the variance of a device's load share (in
    activations) when the fit requests are resampled, for any expert set S (delta method).

    X float[R, N]: activations of each expert by each fit request; load float[N] = X.sum(0).
    Residual of request r on expert e: z[r, e] = X[r, e] - load[e] / T * t[r] (t: the request's
    activations, T their sum), so Sigma = Z^T Z (ours: it is what moves a device's held-out load
    away from its fit load; grouping experts that the same requests use makes it larger).
    gram float64[N, N]: X^T X when the caller has it (the large-trace path's start uses it
    too); then Sigma = X^T X - v w^T - w v^T + (t.t) w w^T with v = X^T t, w = load / T, an
    O(R N) update instead of a second R x N x N product."""
    t = X.sum(axis=1, dtype=np.float64)
    w = load / max(float(load.sum()), 1e-12)
    if gram is None:
        Z = X - np.outer(t, w)
        return Z.T @ Z
    v = X.T @ t
    return gram - np.outer(v, w) - np.outer(w, v) + float(t @ t) * np.outer(w, w)


class LoadModel:
    """Robust device loads: L_d + sqrt(robust x V_d) - sqrt(robust x V0) with L_d the fit load,
    V_d its resampling variance (`load_spread`) and V0 the expected V_d of a uniformly random set
    of N/G experts. So only the spread that a placement adds by grouping experts the same
    requests use costs capacity (ours: charging the unavoidable sampling noise too made the
    planted optimum infeasible); `sigma` None gives the plain fit load.

    load float[N]: fit activations per expert; sigma float64[N, N] (`load_spread`) or None; cap:
    the balance cap in activations; G devices; robust (`SemparConfig.robust`): z^2 of the margin,
    z^2 x (1 + fit/eval size)."""

    def __init__(self, load: np.ndarray, sigma: np.ndarray | None, cap: float, G: int, *,
                 robust: float):
        self.load, self.cap, self.cap_devices = load, cap, G
        self.sigma = None if sigma is None else robust * sigma
        self.offset = 0.0
        if sigma is not None:
            N = load.size
            S = N // G
            tr = float(np.trace(self.sigma))      # 1^T sigma 1 = 0: residuals sum to 0 per request
            self.offset = np.sqrt(max(tr * S / N * (1 - (S - 1) / max(N - 1, 1)), 0.0))

    def of(self, dev: np.ndarray, G: int) -> np.ndarray:
        L = np.bincount(dev, weights=self.load, minlength=G)
        if self.sigma is None:
            return L
        S = self.by_device(dev, G)                  # V_g = sum of sigma over g's expert pairs
        V = np.bincount(dev, weights=S[np.arange(dev.size), dev], minlength=G)
        return L + np.sqrt(np.maximum(V, 0.0)) - self.offset

    def by_device(self, dev: np.ndarray, G: int) -> np.ndarray:
        """float64[N, G]: sum of sigma[e, m] over the experts m on each device."""
        return self.sigma @ onehot(dev, G).astype(np.float64)


def onehot(dev: np.ndarray, G: int) -> np.ndarray:
    out = np.zeros((dev.size, G), np.float32)
    out[np.arange(dev.size), dev] = 1.0
    return out


def layer_load_model(X: np.ndarray, imb: float, G: int, robust: float) -> LoadModel:
    """The load model of one layer from the fit requests' counts X float[R, N]: cap `imb` x the
    mean load (below 1.0 too: held_out.py's step 6), the resampling spread of the requests as
    its margin."""
    load = X.sum(axis=0, dtype=np.float64)
    return LoadModel(load, load_spread(X.astype(np.float64), load), imb * load.sum() / G, G,
                     robust=robust)


def layer_request_counts(stats: AffinityStats, l: int) -> np.ndarray:
    """float32[R, N]: activations of each expert by each fit request at layer l."""
    return request_counts(stats.request_index, stats.trace.experts[:, l], stats.R,
                          stats.N).astype(np.float32)
