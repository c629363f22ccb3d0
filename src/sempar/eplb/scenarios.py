"""The load scenarios of a robust rebalance (ours, issue 43; `policy` step 4): the live window
the engine hands the policy, and runs of FILE's rows, each a mix the traffic has had.

Under drift the next window is not the last one: a layout balanced on the summed window alone
leaves on one device a group of co-activated experts that spike together when the mix moves
(the replay's steps right after a task switch). Balancing the worst of several load vectors
(the window and contiguous splits of FILE's sample, in arrival order) makes the layout hold on
every split, so on any mix between them, and pulls such groups apart; `drift/history.py`'s
robust bound does the same for the incremental step over older windows.
"""

from __future__ import annotations

import numpy as np

from sempar.eplb.config import PluginConfig

EPS = 1e-12


def scenario_loads(w: np.ndarray, sample: np.ndarray | None, K: int) -> np.ndarray:
    """float64[L, K', N]: the load vectors a robust rebalance balances at once (ours): row 0 the
    live window w float[L, N]; rows 1.. the loads of K - 1 contiguous splits of FILE's sample
    rows int[T, L, k] (in arrival order, so a split is a run of requests: a mix the traffic
    has had), each scaled to the window's total per layer. The next window's mix is not the
    last one's under drift; a layout that holds on every split holds on any mix between them,
    and experts that spike together in some run of requests are not left on one device.
    K' = 1 (w alone) without a sample, with K <= 1, or with fewer than 2 rows per split."""
    w = np.asarray(w, np.float64)
    if sample is None or K <= 1 or sample.shape[0] < 2 * (K - 1):
        return w[:, None, :]
    L, N = w.shape
    out = np.empty((L, K, N))
    out[:, 0] = w
    key = np.arange(L)[None, :, None] * N + sample.astype(np.int64)
    tot = w.sum(axis=1, keepdims=True)
    for i, part in enumerate(np.array_split(np.arange(sample.shape[0]), K - 1)):
        c = np.bincount(key[part].ravel(), minlength=L * N).reshape(L, N).astype(np.float64)
        out[:, i + 1] = c * (tot / np.maximum(c.sum(axis=1, keepdims=True), EPS))
    return out


def distances(W: np.ndarray) -> np.ndarray:
    """float64[K]: how far each scenario's mix is from the live window's, for one layer's
    scenarios W float[K, N] (row 0 the window, all of one total): the total variation distance
    0.5 x sum |W_i - W_0| / sum W_0 (0: the same mix, 1: disjoint experts)."""
    tot = max(float(W[0].sum()), EPS)
    return 0.5 * np.abs(W - W[:1]).sum(axis=1) / tot


def caps_of(W: np.ndarray, cfg: PluginConfig) -> np.ndarray:
    """float64[K]: each scenario's bound on max / mean device load, for one layer's scenarios W
    float[K, N]: the live window's `max_imbalance`; a split's that + `scenario_slack` +
    `scenario_distance` x its distance from the window (`distances`; ours, issue 43): a split
    whose mix is far from the live one is a run of requests the traffic has moved away from, so
    it bounds the layout loosely and costs little locality, while a split near the window (the
    steady traffic's runs) keeps almost the window's bound. K = 1: [max_imbalance], the rule
    without scenarios."""
    K = W.shape[0]
    caps = np.full(K, cfg.max_imbalance + cfg.scenario_slack)
    if K > 1 and cfg.scenario_distance:
        caps += cfg.scenario_distance * distances(W)
    caps[0] = cfg.max_imbalance
    return caps


def robust_imbalance(load: np.ndarray, caps: np.ndarray) -> float:
    """The worst scenario's max / mean of device loads float[K, G], less its slack over the
    live window's bound (caps float[K], `caps_of`): the live window's imbalance when K = 1."""
    imb = load.max(axis=1) / np.maximum(load.mean(axis=1), EPS)
    return float((imb - (caps - caps[0])).max())


