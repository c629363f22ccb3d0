"""Throughput under an SLO searched on the request rate (serving/slo_search.py): the bracket and
bisection on a known crossing, seed-stable arrivals, a uniformly faster system credited in
proportion under every SLO, and the plan's choice within the forecast's noise (choose.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sempar.comm.topology_presets import load_topology
from sempar.serving.choose import choose
from sempar.serving.dims import model_dims
from sempar.serving.forecast import Forecaster, default_rates
from sempar.serving.metrics import SLO_KEYS, SLO_STAT, slos_from
from sempar.serving.slo_search import SearchConfig, search
from sempar.serving.systems import resolve
from sempar.serving.workload import stable_arrivals
from sempar.trace import read_trace

from conftest import SLOW


def _point(rate: float, crossing: float) -> dict:
    """A stand-in run whose every SLO statistic grows with the rate: 1.0 at `crossing`."""
    return {"rate": rate, "throughput": 100.0 * rate, **{s: rate / crossing for s in SLO_STAT.values()}}


@pytest.mark.parametrize("crossing", [7.3, 12.9, 19.99])
def test_bisection_narrows_the_grid_bracket_to_the_tolerance(crossing):
    calls = []

    def run_at(r):
        calls.append(r)
        return _point(r, crossing)

    grid = [_point(r, crossing) for r in (5.0, 10.0, 15.0, 20.0)]
    slos = {k: 1.0 for k in SLO_KEYS}
    cfg = SearchConfig(tolerance=0.02)
    found, extra = search(run_at, grid, slos, {"e2e": ("e2e",), "both": ("ttft", "e2e")}, cfg)
    for f in found.values():
        lo, hi = f["rate_interval"]
        assert lo <= crossing < hi and hi - lo <= 0.02 * lo and f["converged"]
        assert f["rate"] == lo and f["throughput"] == pytest.approx(100 * lo)
        assert f["throughput_interval"] == [pytest.approx(100 * lo), pytest.approx(100 * hi)]
    # one simulation serves both targets (same keys' crossing): no more steps than one search
    assert len(calls) == len(extra) <= 8 and all(5.0 < r < 20.0 for r in calls)


def test_open_brackets_go_beyond_the_grid():
    grid = [_point(r, 50.0) for r in (5.0, 10.0)]           # every grid rate meets
    found, _ = search(lambda r: _point(r, 50.0), grid, {"e2e": 1.0}, {"e2e": ("e2e",)},
                      SearchConfig(extend=3))
    lo, hi = found["e2e"]["rate_interval"]
    assert lo <= 50.0 < hi <= 80.0
    grid = [_point(r, 2.0) for r in (5.0, 10.0)]            # the lowest already misses
    found, _ = search(lambda r: _point(r, 2.0), grid, {"e2e": 1.0}, {"e2e": ("e2e",)},
                      SearchConfig(extend=3))
    lo, hi = found["e2e"]["rate_interval"]
    assert lo <= 2.0 < hi
    found, _ = search(lambda r: _point(r, 0.01), grid, {"e2e": 1.0}, {"e2e": ("e2e",)},
                      SearchConfig(extend=2))
    assert found["e2e"]["rate"] is None and found["e2e"]["rate_interval"][1] == 1.25


def test_stable_arrivals_are_one_stream_scaled_by_the_rate():
    a, b = stable_arrivals(40.0, 30.0, [0, 0]), stable_arrivals(80.0, 30.0, [0, 0])
    assert a.size > 1000 and b.size > a.size
    assert np.allclose(b[:a.size] * 2, a)
    assert (a < 30.0).all() and (np.diff(a) >= 0).all()
    assert a.size == pytest.approx(1200, rel=0.1)
    assert not np.array_equal(stable_arrivals(40.0, 30.0, [0, 1]), a)


@pytest.mark.slow
def test_uniformly_faster_iterations_give_proportional_throughput_under_every_slo(small_trace):
    """A system whose every iteration takes 1/1.5 of the time must sustain >= 1.4x the
    throughput under every SLO, on a coarse grid like the demo's (5 rates from 5% to 120% of
    capacity), where reading the SLO off the grid credits it far less."""
    tr = read_trace(small_trace)
    fc = Forecaster(tr, model_dims(tr.meta.model), load_topology("pcie-upi8"), SLOW, budget=256,
                    max_running=32)
    slow = fc.prepare(resolve("sglang").variants[0])
    fast = dataclasses.replace(slow)
    fast.step_seconds = lambda *a: slow.step_seconds(*a) / 1.5
    io = ("fixed", 128, 16)
    duration = 3.0
    rates = default_rates([slow], 128, 16, 5)
    curves = {n: [fc.run_rate(p, r, duration, *io) for r in rates]
              for n, p in (("slow", slow), ("fast", fast))}
    slos = slos_from(curves["slow"][0], 5.0)
    found = {n: fc.under_slo(p, curves[n], slos, {k: (k,) for k in SLO_KEYS}, duration, *io)[0]
             for n, p in (("slow", slow), ("fast", fast))}
    for k in SLO_KEYS:
        s, f = found["slow"][k], found["fast"][k]
        assert s["converged"] and f["converged"], (k, s, f)
        assert f["throughput"] >= 1.4 * s["throughput"], (k, s, f)


def _row(name, thr, complexity, hi=None):
    return {"pipeline": "sglang-ep", "placement": name, "policy": "round-robin", "redundant": 0,
            "ep": 8, "throughput_under_slo": thr, "throughput_interval": [thr, hi or thr * 1.01],
            "complexity": complexity}


def test_choice_prefers_the_simpler_deployment_within_the_noise():
    ranked = [_row("sempar", 1000.0, 2), _row("eplb", 985.0, 1), _row("vanilla", 900.0, 0)]
    out, choice = choose(ranked, 0.02)
    assert out[0]["placement"] == "eplb" and choice["prefers_simpler"]
    assert len(choice["tied"]) == 2 and "simpler" in choice["text"]
    out, choice = choose(ranked, 0.005)                 # outside the noise: the leader
    assert out[0]["placement"] == "sempar" and not choice["prefers_simpler"]
    # an interval that reaches the leader's figure ties too
    out, choice = choose([_row("sempar", 1000.0, 2), _row("vanilla", 900.0, 0, hi=1001.0)], 0.02)
    assert out[0]["placement"] == "vanilla" and choice["prefers_simpler"]
