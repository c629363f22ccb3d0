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
  budgeted moves, exact gain per byte, the payback rule); under a balancing dispatch with
  replica slots, then the replica pass (`placement.dispatch_peak.replica_pass`, at most
  `ReplayConfig.replicas.max_moves` slots per layer): the slots retargeted to lower the worst,
  over the history's windows, of the least peak that dispatch can serve (rebalance's bound
  counts the nearest copy only, so it cannot see what a replica buys); with
  `ReplicaPass.locality`, among retargets of nearly the least peak the one of most local
  activations on the youngest window (`placement.replica_locality`). While the stream is
  young (`ReplayConfig.young_resamples`) the pass also checks request-bootstrap resamples of
  the youngest window, held to the budget (`history.resample_loads`). The only policy that
  keeps a history:
  the others see the last `window` requests, as the engines' EPLB sees its recorder's window.
  With `ReplayConfig.events` (the default; `Events(enabled=False)` gives the step updates
  alone) it also updates inside a step, as soon as the switch test of `drift.events` finds the
  mix changed in the requests served so far, fitting the new mix as its own window;
- `vllm-eplb`, `sglang-eplb`: each engine's default EPLB policy through the engine's own code,
  at the engine's cadence (`drift.engines`: window, interval, replicas, the old map), its map
  served as the engine returns it (no alignment: the engine copies what changed);
- `sempar-engine`: the sempar plug-in (`sempar.eplb.policy`) through the same path, at the
  cadence of the engine it is plugged into (`--engine`), started from the sempar solve (the
  placement a user launches with, or that the plug-in's first rebalance gives).

Every policy gets the same replica slots (`--redundant R`, `SolveOptions.redundant`) and the
same dispatch among copies (`--dispatch`, `placement.dispatch`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from sempar.drift import engines
from sempar.drift.config import ReplayConfig
from sempar.drift.history import batch_loads, history_sample, resample_loads, window_loads
from sempar.placement.dispatch import DISPATCH
from sempar.placement.dispatch_peak import replica_pass
from sempar.placement.migration import align_devices
from sempar.placement.placement import Placement
from sempar.placement.rebalance import rebalance
from sempar.registry import Registry
from sempar.trace.schema import RoutingTrace

__all__ = ["POLICIES", "ReplayConfig", "ReplayPolicy", "solve_window"]


@dataclass(frozen=True)
class ReplayPolicy:
    """start: "sempar" or "eplb" (the first window's solve); update: (current placement,
    window trace, config) -> next placement, or None (never updates). Capabilities: full_layout
    (each update re-lays every layer), locality (optimises exact-home LAR), budgeted (bounded
    moves per update), history (sees `ReplayConfig.history` beyond the window), events (updates
    inside a step where `drift.events`' switch test fires; update takes `regime=`), help;
    cadence: None (updates before every step from `--window` requests), an engine's name (its
    `engines.CADENCES` entry) or "host" (`ReplayConfig.engine`'s); unavailable: () -> the one-line
    reason it cannot run here (an engine not installed), or None."""

    start: str
    update: Callable[[Placement, RoutingTrace, ReplayConfig], Placement] | None
    full_layout: bool
    locality: bool
    budgeted: bool
    help: str
    history: bool = False
    events: bool = False
    cadence: str | None = None
    unavailable: Callable[[], str | None] | None = None

    def cadence_of(self, cfg: ReplayConfig) -> "engines.Cadence | None":
        """The engine cadence this policy runs at under `cfg` (None: every step)."""
        if self.cadence is None:
            return None
        return engines.CADENCES.get(cfg.engine if self.cadence == "host" else self.cadence)


POLICIES: Registry[ReplayPolicy] = Registry("replay policy")


def solve_window(method: str, window: RoutingTrace, cfg: ReplayConfig) -> Placement:
    """`method`'s placement of the window (`placement.solve` as `place` calls it)."""
    from sempar.placement import solve

    return solve(method, window, num_devices=cfg.ep, options=cfg.solve)


def _resolve(current: Placement, window: RoutingTrace, cfg: ReplayConfig) -> Placement:
    return align_devices(current, solve_window("sempar", window, cfg))


def _eplb(current: Placement, window: RoutingTrace, cfg: ReplayConfig) -> Placement:
    return align_devices(current, solve_window("eplb", window, cfg))


def _incremental(current: Placement, seen: RoutingTrace, cfg: ReplayConfig,
                 regime: int | None = None) -> Placement:
    """rebalance on the history's windows, then the replica pass. `regime` (`drift.events`):
    the last `regime` requests of `seen` are a new mix the switch test found, younger than a
    window: they are window 0, bound at the window's cap, the windows before them at the cap
    + `Events.old_slack` (the old mix still counts, less)."""
    h = cfg.history
    young = regime is not None and cfg.events.enabled
    keep, w, age = history_sample(seen, cfg.window, h, regime if young else None)
    slack = cfg.events.old_slack if young else h.slack
    caps = cfg.rebalance.max_imbalance + slack * (np.arange(int(age.max()) + 1) > 0)
    balances = DISPATCH.get(cfg.dispatch).balances
    rb = replace(cfg.rebalance, split=True) if balances and cfg.split_bound else cfg.rebalance
    nxt = rebalance(current, seen.experts[keep], rb, w, age if h.robust else None, caps)[0]
    if nxt.redundant == 0 or cfg.replicas.max_moves == 0 or not balances:
        return nxt
    # the replica slots, for the peak the balancing dispatch serves on every window of the
    # history (`placement.dispatch_peak`): rebalance's bound counts the nearest copy only
    if cfg.replica_scenarios == "batches":
        loads, ages = batch_loads(seen, cfg.window, h, cfg.rebalance.batch,
                                  regime if young else None)
    else:
        loads, ages = window_loads(seen, cfg.window, h, regime if young else None)
    # resamples of the youngest window too: while the stream is young (`replica_resamples`,
    # set from `young_resamples` on the warm-up and young-stream updates: too few windows to
    # show how the mix varies), and as the guard of retargets chosen for locality
    # (`locality_resamples`)
    draws = max(cfg.replica_resamples,
                cfg.locality_resamples if cfg.replicas.locality > 0 else 0)
    if draws > 0:
        boot = resample_loads(seen, cfg.window, h, draws, cfg.solve.seed,
                              regime if young else None)
        loads = np.concatenate([loads, boot], axis=1)
        ages = np.concatenate([ages, np.zeros(boot.shape[1], ages.dtype)])
    # a resample stands for traffic not seen: held to the budget (the fit cap + the history's
    # slack, as its older windows are), not to the fit cap; as the locality guard, to the
    # target's cap (a retarget for locality must not raise the peak on them at all)
    guard = cfg.replicas.locality > 0 and cfg.locality_resamples > 0
    slack = np.concatenate([np.zeros(loads.shape[1] - draws), np.full(draws, h.slack)]) \
        if draws > 0 and cfg.resample_slack and not guard else None
    # locality counted on the youngest window's kept rows (`ReplicaPass.locality`)
    tokens = seen.experts[keep[age == 0]] if cfg.replicas.locality > 0 else None
    phy, moved = replica_pass(nxt.phy2log, nxt.num_devices, loads,
                              caps[np.minimum(ages, caps.size - 1)], cfg.replicas,
                              tokens=tokens, slack=slack)
    if moved:
        nxt = Placement(phy, nxt.num_experts, nxt.num_devices, nxt.node_of.copy(), nxt.method,
                        {**nxt.info, "replica_pass": moved}).validate()
    return nxt


def _vllm(current: Placement, window: RoutingTrace, cfg: ReplayConfig) -> Placement:
    w = engines.expert_load(window)
    return engines.as_placement(engines.vllm_map(w, current, engines._groups(window)),
                                current, "vllm-eplb")


def _sglang(current: Placement, window: RoutingTrace, cfg: ReplayConfig) -> Placement:
    g = window.meta.num_expert_groups
    w = engines.expert_load(window)
    return engines.as_placement(engines.sglang_map(w, current, g if g and g > 1 else None),
                                current, "sglang-eplb")


def _sempar_engine(current: Placement, window: RoutingTrace, cfg: ReplayConfig) -> Placement:
    w = engines.expert_load(window)
    host = _vllm if cfg.engine == "vllm" else _sglang
    m, why = engines.sempar_map(w, current, engines._groups(window), window,
                                lambda: host(current, window, cfg).phy2log, cfg.solve.seed,
                                cfg.engine, cfg.plugin)
    p = engines.as_placement(m, current, "sempar-engine")
    if why:
        p.info["fallback"] = why         # the engine's default result served this rebalance
    return p


POLICIES.add("static", ReplayPolicy("sempar", None, False, True, True,
                                    "solved once on the first window, never updated"))
POLICIES.add("resolve", ReplayPolicy("sempar", _resolve, True, True, False,
                                     "a full sempar solve on every window"))
POLICIES.add("eplb-periodic", ReplayPolicy("eplb", _eplb, True, False, False,
                                           "DeepSeek EPLB on every window's loads (the engines')"))
POLICIES.add("sempar-incremental", ReplayPolicy("sempar", _incremental, False, True, True,
                                                "sempar rebalance on every window and its "
                                                "load history, and at once on a switch of "
                                                "the mix", history=True, events=True))
POLICIES.add("vllm-eplb", ReplayPolicy("eplb", _vllm, True, False, False,
                                       "vLLM's default EPLB policy, through vLLM's code, at its "
                                       "cadence", cadence="vllm",
                                       unavailable=engines.vllm_unavailable))
POLICIES.add("sglang-eplb", ReplayPolicy("eplb", _sglang, True, False, False,
                                         "SGLang's default EPLB algorithm, through SGLang's code, "
                                         "at its cadence", cadence="sglang",
                                         unavailable=engines.sglang_unavailable))
POLICIES.add("sempar-engine", ReplayPolicy("sempar", _sempar_engine, True, True, True,
                                           "the sempar EPLB plug-in through the engine's path, "
                                           "at --engine's cadence", cadence="host",
                                           unavailable=engines.sempar_unavailable))
