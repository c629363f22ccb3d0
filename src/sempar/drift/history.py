"""A load history for the incremental step: the last requests weighed by age, so that the step
fits the next window's predicted traffic instead of the last window alone.

Every policy of `sempar replay` sees the last `window` requests; under a mix that changes, the
last window is a poor forecast of the next (a placement fitted to it balances the last task and
clusters the next one's experts). An exponentially weighted history is the plain forecast of a
drifting mean (ours: the papers place offline and never forecast): request r, `age` whole windows
before the update (0: the window itself), weighs `decay ** age`; `windows` windows of history
beyond the window are kept (older ones weigh little and cost rows). `history_weights` gives each
row of the history trace its request's weight; `placement.rebalance` takes them as row weights
in both its objective (exact-home LAR) and its bound (served load per device).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sempar.drift.streams import request_table
from sempar.errors import InputError
from sempar.trace.schema import RoutingTrace


@dataclass(frozen=True)
class History:
    """How much of the past the incremental step sees: `windows` windows beyond the last one,
    request weights `decay ** age` (age in windows, 0 for the last window)."""

    windows: int = 3
    decay: float = 0.5
    robust: bool = True      # the bound on every window of the history, not on their blend
    slack: float = 0.05      # older windows' bound: the window's + slack
    rows: int = 4096         # rows kept of the last window (cost: an evenly spaced subsample)
    older_rows: int = 1024   # rows kept of each older window

    def __post_init__(self) -> None:
        if self.windows < 0 or not 0.0 < self.decay <= 1.0 or min(self.rows, self.older_rows) < 1:
            raise InputError(f"history: windows {self.windows} / decay {self.decay} out of range")

    def span(self, window: int) -> int:
        """Requests the step sees: the window and `windows` windows before it."""
        return window * (1 + self.windows)


def history_rows(trace: RoutingTrace, window: int, history: History,
                 regime: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(weight float64[T], age int64[T]) of each row: its request's age in whole windows of
    requests before the trace's last request (0: the last window; the trace's requests in
    arrival order) and `decay ** age`. `regime`: the last `regime` requests are window 0 (a
    switch `drift.events` detected: the new mix is its own scenario), the windows before them
    counted back from its first request."""
    _, _, rows, starts = request_table(trace)
    R = starts.size - 1
    if regime is not None and 0 < regime < R:
        pre = R - regime
        age_r = np.where(np.arange(R) >= pre, 0, 1 + (pre - 1 - np.arange(R)) // max(window, 1))
    else:
        age_r = (R - 1 - np.arange(R)) // max(window, 1)                 # [R] in windows
    age = np.empty(trace.num_tokens, np.int64)
    age[rows] = np.repeat(age_r, np.diff(starts))
    return history.decay ** age.astype(np.float64), age


def history_sample(trace: RoutingTrace, window: int, history: History,
                   regime: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows int64[n], weight float64[n], age int64[n]): the rows the incremental step fits,
    per window at most `rows` (the last) / `older_rows` (the others) evenly spaced rows (in
    arrival order, so every request keeps its share), each weighed `decay ** age` x the
    window's rows per kept row (the window's total weight is kept); `regime` as
    `history_rows`."""
    w, age = history_rows(trace, window, history, regime)
    keep, weight = [], []
    for a in np.unique(age):
        idx = np.flatnonzero(age == a)
        cap = history.rows if a == 0 else history.older_rows
        take = idx[np.linspace(0, idx.size - 1, min(cap, idx.size)).astype(np.int64)]
        keep.append(take)
        weight.append(w[take] * (idx.size / take.size))
    rows = np.concatenate(keep)
    order = np.argsort(rows, kind="stable")
    return rows[order], np.concatenate(weight)[order], age[rows[order]]


def window_loads(trace: RoutingTrace, window: int, history: History,
                 regime: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(loads float64[L, H, N], ages int64[H]): each layer's expert activations in each window
    of the history (`history_rows`' ages, those present, youngest first), unweighted: the
    scenarios a replica layout is checked on one by one (`placement.dispatch_peak`); `regime`
    as `history_rows`."""
    _, age = history_rows(trace, window, history, regime)
    T, L, k = trace.experts.shape
    N = trace.meta.num_experts
    ages = np.unique(age)
    H = ages.size
    pos = np.searchsorted(ages, age)                                      # [T] scenario
    key = (np.arange(L)[None, :, None] * H + pos[:, None, None]) * N + trace.experts
    loads = np.bincount(key.ravel(), minlength=L * H * N).reshape(L, H, N).astype(np.float64)
    return loads, ages


def batch_loads(trace: RoutingTrace, window: int, history: History, batch: int,
                regime: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(loads float64[L, H, N], ages int64[H]): as `window_loads`, but each window split into
    its dispatch batches (`batch` rows in arrival order, the last one shorter), one scenario
    per batch, its window's age beside it. A per-batch dispatch (`lp-cap`) balances each batch
    on its own: a layout whose copies split a window's total evenly can still leave single
    batches far above the cap (MMLU EP 8: the worst batch's least peak 1.33-1.37 on EPLB's
    layout of the step's own requests, the step's total 1.00-1.01)."""
    _, age = history_rows(trace, window, history, regime)
    _, _, rows, _ = request_table(trace)
    T, L, k = trace.experts.shape
    N = trace.meta.num_experts
    age_a = age[rows]                                                     # arrival order
    ages = np.unique(age_a)
    scen, scen_age = np.empty(T, np.int64), []
    for a in ages[::-1]:                                # oldest first: arrival order
        idx = np.flatnonzero(age_a == a)
        pos = np.arange(idx.size) // max(batch, 1)
        scen[idx] = len(scen_age) + pos
        scen_age += [int(a)] * (int(pos[-1]) + 1)
    H = len(scen_age)
    key = (np.arange(L)[None, :, None] * H + scen[:, None, None]) * N + trace.experts[rows]
    loads = np.bincount(key.ravel(), minlength=L * H * N).reshape(L, H, N).astype(np.float64)
    return loads, np.array(scen_age, np.int64)


def resample_loads(trace: RoutingTrace, window: int, history: History, draws: int, seed: int,
                   regime: int | None = None) -> np.ndarray:
    """float64[L, draws, N]: each layer's expert activations in `draws` request-bootstrap
    resamples of the youngest window (`history_rows`' age 0; `regime` as there): the window's
    requests drawn with replacement, as many as it holds (seeded). The scenarios a replica
    layout is checked on beside the windows while the history is young (`ReplayConfig.
    young_resamples`): a window of a few requests is one draw of a mix that is still being
    discovered, and the next window differs from it by about a resample's spread (the
    request bootstrap of `placement.sempar.held_out`)."""
    _, age = history_rows(trace, window, history, regime)
    _, _, rows, starts = request_table(trace)
    R = starts.size - 1
    req = np.empty(trace.num_tokens, np.int64)
    req[rows] = np.repeat(np.arange(R), np.diff(starts))
    young = np.flatnonzero(age == 0)
    reqs, pos = np.unique(req[young], return_inverse=True)                 # [Rw], [Ty]
    T, L, k = trace.experts.shape
    N = trace.meta.num_experts
    Rw = reqs.size
    key = (pos[:, None, None] * L + np.arange(L)[None, :, None]) * N + trace.experts[young]
    per = np.bincount(key.ravel(), minlength=Rw * L * N).reshape(Rw, L * N).astype(np.float64)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(Rw, np.full(Rw, 1.0 / Rw), size=draws).astype(np.float64)  # [B, Rw]
    return (counts @ per).reshape(draws, L, N).transpose(1, 0, 2)
