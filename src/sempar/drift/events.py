"""Event-triggered updates for the incremental step: detect a switch of the traffic mix from the
requests already served and update at once, instead of waiting for the next step (issue 45).

Why: on the drift streams the imbalance p95 is set by the first step after a switch to traffic
the window never held (docs/drift.md); every policy that updates only between steps serves that
whole step on a layout fitted to the old mix. Served requests are known as soon as they are
served, so a policy may look at them: a layout fitted on the first request of a new ESFT task
already serves the rest of that step near the ceiling (EPLB on it: 1.07-1.10 at EP 8 where the
step-boundary update gave 1.32-1.39).

The test (ours; a two-sample test after the permutation idea, not from the papers): after each
served request r, for each scale c in `scales` (c requests ending at r, all served since the
layout's last update), the distance between their expert-load distribution and that of the
`window` requests before them,

    d = mean over layers of the total variation between the two normalised histograms,

is compared with the same distance for c-request parts of those window requests against the
rest of the window (the null: the spread the mix itself shows, heavier for a mixed window than
for one task). The switch is declared when d / max(null) > `threshold` at some scale: a mixed
window does not trigger on its own variety, a new task does.

The null's parts (`Events.null`):

- `"subsets"` (the default, the first form): `draws` random c-request subsets of the window.
- `"blocks"` (`Events.blocks()`, threshold 1.9): every contiguous run of c requests of the
  window (a moving-block bootstrap, the form of the null for serially dependent data). Traffic
  arrives in runs (an MMLU group is a sequence of subjects a few requests each), and a block of
  the next run is what the test sees at a switch; random subsets mix the runs and understate
  the window's spread at small c. Calibrated on the benchmark's three drift streams
  (`benchmarks/drift_switch_test.py`): inside a task / group the largest score is 1.32 (ESFT
  tasks) / 1.85 (MMLU groups), at the real ESFT switches 2.0-5.4; at 1.9 it fires at every
  switch the first test found on ESFT and, on MMLU, only at the switch to the last group,
  where the first test fires 6 times, 3 inside a group. Not the default: the updates those
  false alarms start are balance updates the layout needed (replicas suite, lp-cap, R = G:
  MMLU p95 1.099 -> 1.123 at EP 4, 1.180 -> 1.217 at EP 8; copies 53.3 -> 28.4 / 64.4 -> 40.2
  GB, LAR +0.002 / +0.007; docs/drift.md).

On a switch the request where it starts (r - c + 1) opens a **regime**: until it is a window
long, the update fits it as its own scenario (`history.history_rows(regime=...)`: the regime is
window 0, the window before it window 1, ...), at `max_moves` moves and `replica_moves` replica
slots per layer (a new mix needs more than a step's few moves; every copy is counted as
always). While the regime is young the update is repeated when it reaches 2, 4, 8, ... requests
(`regrow`), so the layout follows the new mix as it is seen; once a window long, the ordinary
step updates take over.

Shapes: R requests, L layers, N experts; histograms float64[R, L, N].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sempar.drift.streams import request_table
from sempar.errors import InputError
from sempar.trace.schema import RoutingTrace


@dataclass(frozen=True)
class Events:
    """The switch test and the event update's budget (module docstring)."""

    enabled: bool = True
    scales: tuple[int, ...] = (1, 2, 4, 8)   # requests tested as one block, ending at the last
    threshold: float = 1.5       # distance / the window's own largest part distance
    null: str = "subsets"        # the null's parts: random "subsets", or contiguous "blocks"
    draws: int = 40              # random subsets of the window per scale ("subsets" only)
    max_moves: int = 128         # rebalance moves of an event update
    replica_moves: int = 4       # replica slots per layer of an event update
    regrow: bool = True          # update again at regime lengths 2, 4, 8, ... below a window
    old_slack: float = 0.10      # older windows' bound while a regime is young: cap + this
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.scales or min(self.scales) < 1 or self.threshold <= 0 or self.draws < 1 \
                or self.max_moves < 0 or self.replica_moves < 0:
            raise InputError(f"events: scales {self.scales} / threshold {self.threshold} / "
                             f"draws {self.draws} / moves {self.max_moves} out of range")
        if self.null not in ("blocks", "subsets"):
            raise InputError(f"events: null {self.null!r}: blocks or subsets")

    @classmethod
    def subsets(cls, **knobs) -> "Events":
        """The first switch test, the default: random-subset null, threshold 1.5."""
        return cls(**{"null": "subsets", "threshold": 1.5, **knobs})

    @classmethod
    def blocks(cls, **knobs) -> "Events":
        """The calibrated switch test: contiguous-block null, threshold 1.9 (module
        docstring: no false alarm inside a group, fewer copies, but less balance on MMLU)."""
        return cls(**{"null": "blocks", "threshold": 1.9, **knobs})


def request_histograms(trace: RoutingTrace) -> np.ndarray:
    """float64[R, L, N]: each request's expert activations per layer, requests in arrival
    order (`streams.request_table`)."""
    _, _, rows, starts = request_table(trace)
    T, L, k = trace.experts.shape
    N = trace.meta.num_experts
    req = np.repeat(np.arange(starts.size - 1), np.diff(starts))          # [T] in `rows` order
    key = (req[:, None, None] * L + np.arange(L)[None, :, None]) * N + trace.experts[rows]
    return np.bincount(key.ravel(), minlength=(starts.size - 1) * L * N
                       ).reshape(starts.size - 1, L, N).astype(np.float64)


def _tv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean over layers of the total variation of histograms a, b float[..., L, N]."""
    a = a / np.maximum(a.sum(axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(b.sum(axis=-1, keepdims=True), 1e-12)
    return 0.5 * np.abs(a - b).sum(axis=-1).mean(axis=-1)


def switch_score(hist: np.ndarray, r: int, c: int, window: int,
                 rng: np.random.Generator, draws: int, null: str = "blocks") -> float:
    """d / max(null) (module docstring) of requests (r - c, r] against the `window` requests
    before them, the null's parts `null` ("blocks": every contiguous c-run of the window;
    "subsets": `draws` random c-subsets, from `rng`); 0.0 where fewer than a window precede
    them. hist float[R, L, N]."""
    lo = r - c + 1 - window
    if lo < 0 or c >= window:
        return 0.0
    ref = hist[lo:r - c + 1]
    tot = ref.sum(axis=0)
    d = float(_tv(hist[r - c + 1:r + 1].sum(axis=0), tot))
    if null == "blocks":
        cum = np.concatenate([np.zeros((1,) + ref.shape[1:]), np.cumsum(ref, axis=0)])
        sub = cum[c:] - cum[:-c]                                     # [window - c + 1, L, N]
    else:
        idx = np.argsort(rng.random((draws, window)), axis=1)[:, :c]         # [draws, c]
        sub = ref[idx].sum(axis=1)                                           # [draws, L, N]
    null = float(_tv(sub, tot[None] - sub).max())
    return d / max(null, 1e-12)


def detect(hist: np.ndarray, r: int, fresh: int, window: int, cfg: Events,
           rng: np.random.Generator) -> int:
    """The length c of the block ending at request r that the test declares a switch (the
    regime starts at r - c + 1), or 0. Only blocks of requests served since the layout's last
    update (`fresh` of them) are tested."""
    for c in sorted(cfg.scales):
        if c > fresh:
            break
        if switch_score(hist, r, c, window, rng, cfg.draws, cfg.null) > cfg.threshold:
            return c
    return 0
