"""Re-placement policies `sempar replay` compares, registered once by name with capabilities.

Every policy starts from a placement solved on the stream's first window (`start`: the
`sempar` solve, or `eplb` for the engines' own policy) and, every `--every` requests, may
update it from the last `--window` requests:

- `static`: never (today's sempar: solve once, serve);
- `resolve`: a full `sempar` solve on the window (the locality ceiling of re-solving, at full
  migration cost), its devices aligned to the current placement per layer
  (`migration.align_devices`) so that only what changed is copied;
- `eplb-periodic`: DeepSeek EPLB on the window's expert loads (`placement/eplb.py`), what
  SGLang's `--enable-eplb` (every `--eplb-rebalance-num-iterations`) and vLLM's EPLB
  (`step_interval`) do: load only, no locality, no migration price; aligned likewise;
- `sempar-incremental`: `placement.rebalance` on the window and its load history
  (`drift.history`: the bound on each of the last windows, the objective weighed by age;
  budgeted moves, exact gain per byte, the payback rule). The only policy that keeps a history:
  the others see the last `window` requests, as the engines' EPLB sees its recorder's window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from sempar.drift.history import History, history_sample
from sempar.placement.migration import align_devices
from sempar.placement.placement import Placement
from sempar.placement.rebalance import RebalanceConfig, rebalance
from sempar.registry import Registry
from sempar.trace.schema import RoutingTrace


@dataclass(frozen=True)
class ReplayConfig:
    """The replay's knobs: EP degree, step and window in requests, the full solves' settings
    and the incremental step's config."""

    ep: int
    every: int = 16                     # requests served per step (updates between steps)
    window: int = 32                    # requests each update sees (the last ones served)
    max_steps: int | None = None        # stop after this many steps (None: the whole stream)
    seed: int = 0
    jobs: int | None = 1                # worker processes of the sempar solves
    max_imbalance: float = 1.05         # the sempar solves' fit cap (`place`'s default)
    rebalance: RebalanceConfig = field(default_factory=RebalanceConfig)
    history: History = field(default_factory=History)   # sempar-incremental's load history

    def span(self, policy: "ReplayPolicy") -> int:
        """Requests `policy`'s update sees: the window, and the history where it keeps one."""
        return self.history.span(self.window) if policy.history else self.window


@dataclass(frozen=True)
class ReplayPolicy:
    """start: "sempar" or "eplb" (the first window's solve); update: (current placement,
    window trace, config) -> next placement, or None (never updates). Capabilities: full_layout
    (each update re-lays every layer), locality (optimises exact-home LAR), budgeted (bounded
    moves per update), history (sees `ReplayConfig.history` beyond the window), help."""

    start: str
    update: Callable[[Placement, RoutingTrace, ReplayConfig], Placement] | None
    full_layout: bool
    locality: bool
    budgeted: bool
    help: str
    history: bool = False


POLICIES: Registry[ReplayPolicy] = Registry("replay policy")


def solve_window(method: str, window: RoutingTrace, cfg: ReplayConfig) -> Placement:
    """`method`'s placement of the window (`placement.solve` as `place` calls it)."""
    from sempar.placement import solve

    return solve(method, window, num_devices=cfg.ep, seed=cfg.seed,
                 max_imbalance=cfg.max_imbalance, jobs=cfg.jobs)


def _resolve(current: Placement, window: RoutingTrace, cfg: ReplayConfig) -> Placement:
    return align_devices(current, solve_window("sempar", window, cfg))


def _eplb(current: Placement, window: RoutingTrace, cfg: ReplayConfig) -> Placement:
    return align_devices(current, solve_window("eplb", window, cfg))


def _incremental(current: Placement, seen: RoutingTrace, cfg: ReplayConfig) -> Placement:
    h = cfg.history
    keep, w, age = history_sample(seen, cfg.window, h)
    caps = cfg.rebalance.max_imbalance + h.slack * (np.arange(h.windows + 1) > 0)
    return rebalance(current, seen.experts[keep], cfg.rebalance, w,
                     age if h.robust else None, caps)[0]


POLICIES.add("static", ReplayPolicy("sempar", None, False, True, True,
                                    "solved once on the first window, never updated"))
POLICIES.add("resolve", ReplayPolicy("sempar", _resolve, True, True, False,
                                     "a full sempar solve on every window"))
POLICIES.add("eplb-periodic", ReplayPolicy("eplb", _eplb, True, False, False,
                                           "DeepSeek EPLB on every window's loads (the engines')"))
POLICIES.add("sempar-incremental", ReplayPolicy("sempar", _incremental, False, True, True,
                                                "sempar rebalance on every window and its "
                                                "load history", history=True))
