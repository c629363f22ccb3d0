"""Throughput under an SLO, found by search on the request rate (the one place `serve-sim` and
`plan` compute it).

Both papers report the highest request rate a system sustains within an SLO, not the highest
point of a coarse grid: read off a grid, two systems whose SLO crossings fall between the same
two grid rates score the same, however far apart they are (issue #30: a system 1.9x better per
iteration read 1.00x). So, per target (a set of SLO keys that must all hold):

1. bracket with the grid: `lo` = the largest grid rate such that it and every lower grid rate
   meet the target, `hi` = the next grid rate (which misses). When the top grid rate still
   meets, the rate is doubled (at most `extend` times) until one misses; when the lowest
   misses, it is halved likewise until one meets;
2. bisect: simulate the midpoint of the widest bracket (relative to its `lo`) among the targets
   not yet within `tolerance`; the point updates every target whose bracket holds it (one
   simulation serves all keys), until every bracket is within `tolerance` x `lo` or `max_steps`
   simulations were spent.

Each step is a simulation of its own: `run_at(rate)` -> the metrics of that rate's arrivals
(forecast.Forecaster.run_rate, seed-stable: one unit-rate arrival stream scaled by the rate).
Reported per target: `rate` = `lo` (a simulated rate that meets) and the throughput there, the
interval [lo, hi] of rates and of throughputs (hi: the nearest simulated rate that misses; None
when none was found; an overloaded run can end with less throughput than `lo`'s, so the upper
throughput is at least `lo`'s), and the steps spent. Bisection assumes the target is met below the
crossing and missed above it (latency grows with load); it finds a crossing within the grid's
bracket. The curves keep the grid; the searched points are returned apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sempar.serving.metrics import SLO_STAT


@dataclass(frozen=True)
class SearchConfig:
    """tolerance: stop when hi - lo <= tolerance x lo; max_steps: simulations per search beyond
    the grid, all targets together; extend: doublings (halvings) tried beyond the grid."""

    tolerance: float = 0.02
    max_steps: int = 24
    extend: int = 3


def meets(point: dict, slos: dict, keys) -> bool:
    """Whether one run's statistics are within the SLO of every key in `keys`."""
    return all(point[SLO_STAT[k]] <= slos[k] for k in keys)


def _bracket(pts: list[dict], ok) -> tuple[dict | None, dict | None]:
    lo = None
    for p in pts:
        if not ok(p):
            return lo, p
        lo = p
    return lo, None


def search(run_at: Callable[[float], dict], grid: list[dict], slos: dict,
           targets: dict[str, tuple[str, ...]], cfg: SearchConfig = SearchConfig()
           ) -> tuple[dict[str, dict], list[dict]]:
    """Per target name (keys that must all hold): the throughput under it, found by bracketing
    with `grid` (metrics dicts with "rate", "throughput") and bisection. Returns ({name:
    {rate, throughput, rate_interval, throughput_interval, steps, converged}}, the points
    simulated beyond the grid, by rate)."""
    seen = {p["rate"]: p for p in grid}
    extra: list[dict] = []
    steps = {t: 0 for t in targets}

    def at(rate: float) -> dict:
        if rate not in seen:
            seen[rate] = run_at(rate)
            extra.append(seen[rate])
        return seen[rate]

    br = {}
    for t, keys in targets.items():
        ok = lambda p, keys=keys: meets(p, slos, keys)   # noqa: E731
        lo, hi = _bracket(sorted(seen.values(), key=lambda p: p["rate"]), ok)
        for _ in range(cfg.extend):                  # open brackets: beyond the grid
            if lo is not None and hi is not None:
                break
            p = at(lo["rate"] * 2 if hi is None else hi["rate"] / 2)
            steps[t] += 1
            if ok(p):
                lo = p if lo is None or p["rate"] > lo["rate"] else lo
            else:
                hi = p if hi is None or p["rate"] < hi["rate"] else hi
        br[t] = [lo, hi]
    spent = 0
    while spent < cfg.max_steps:
        open_ = [(br[t][1]["rate"] / br[t][0]["rate"] - 1, t) for t in targets
                 if br[t][0] is not None and br[t][1] is not None
                 and br[t][1]["rate"] - br[t][0]["rate"] > cfg.tolerance * br[t][0]["rate"]]
        if not open_:
            break
        _, t = max(open_)
        p = at((br[t][0]["rate"] + br[t][1]["rate"]) / 2)
        spent += 1
        for u, keys in targets.items():             # one point narrows every bracket holding it
            lo, hi = br[u]
            if lo is None or hi is None or not lo["rate"] < p["rate"] < hi["rate"]:
                continue
            steps[u] += 1
            br[u][0 if meets(p, slos, keys) else 1] = p
    out = {}
    for t in targets:
        lo, hi = br[t]
        out[t] = {"rate": None if lo is None else lo["rate"],
                  "throughput": None if lo is None else lo["throughput"],
                  "rate_interval": [None if lo is None else lo["rate"],
                                    None if hi is None else hi["rate"]],
                  "throughput_interval": [None if lo is None else lo["throughput"],
                                          None if hi is None else
                                          max(hi["throughput"], lo["throughput"] if lo else 0.0)],
                  "steps": steps[t],
                  "converged": lo is not None and hi is not None
                  and hi["rate"] - lo["rate"] <= cfg.tolerance * lo["rate"]}
    return out, sorted(extra, key=lambda p: p["rate"])
