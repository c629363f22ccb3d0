"""The incremental step's load history (drift/history.py) and the scenario bound it gives
`placement.rebalance`, on the shipped real DeepSeek-V2-Lite ESFT trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sempar
from sempar.drift.history import History, history_rows, history_sample
from sempar.drift.policies import POLICIES, ReplayConfig
from sempar.drift.streams import drift_stream, request_table
from sempar.errors import InputError
from sempar.placement import solve
from sempar.placement.rebalance import RebalanceConfig, rebalance

ESFT = Path(sempar.__file__).parent / "assets" / "traces" / "deepseek-v2-lite-esft.parquet"


def requests(trace, a: int, b: int):
    _, _, rows, starts = request_table(trace)
    return trace.take(rows[starts[a]:starts[b]])


@pytest.fixture(scope="module")
def mixture():
    from sempar.trace import read_trace

    return drift_stream(read_trace(ESFT, optional=("domain",)), "mixture", switch_every=8,
                        mix=0.8, seed=0)


def test_ages_and_weights_follow_arrival_order(mixture):
    seen = requests(mixture, 0, 24)                          # 3 windows of 8 requests
    w, age = history_rows(seen, 8, History(windows=2, decay=0.5))
    _, _, rows, starts = request_table(seen)
    per_req = np.array([age[rows[starts[r]]] for r in range(24)])
    assert per_req.tolist() == [2] * 8 + [1] * 8 + [0] * 8   # the last window is age 0
    assert np.allclose(w, 0.5 ** age)


def test_sample_caps_rows_and_keeps_each_windows_weight(mixture):
    seen = requests(mixture, 0, 32)
    h = History(windows=3, rows=500, older_rows=100)
    keep, w, age = history_sample(seen, 8, h)
    full_w, full_age = history_rows(seen, 8, h)
    assert np.all(np.diff(keep) > 0)                         # arrival order kept
    for a in range(4):
        n = int((age == a).sum())
        assert n == min(500 if a == 0 else 100, int((full_age == a).sum()))
        assert w[age == a].sum() == pytest.approx(full_w[full_age == a].sum())
    with pytest.raises(InputError):
        History(decay=0.0)


def test_the_bound_holds_on_every_scenario_not_their_blend(mixture):
    """Two windows of different mixes: balanced on their blend is not balanced on each; with
    scenarios, enough balance moves bring every window within its bound (or closer)."""
    a, b = requests(mixture, 0, 8), requests(mixture, 8, 16)
    cur = solve("vanilla", a, num_devices=4)
    both = np.concatenate([a.experts, b.experts])
    grp = np.r_[np.zeros(a.num_tokens, int), np.ones(b.num_tokens, int)]
    cfg = RebalanceConfig(max_moves=400, max_imbalance=1.10, horizon_s=1e-9)

    def worst(p, ex):
        from sempar.drift.replay import serve_figures

        return serve_figures(p, ex, cfg.batch)[1]

    blend = rebalance(cur, both, cfg)[0]
    robust, res = rebalance(cur, both, cfg, group=grp)
    for ex in (a.experts, b.experts):
        assert worst(robust, ex).max() <= 1.10 + 1e-9
    assert max(worst(blend, a.experts).max(), worst(blend, b.experts).max()) >= \
        max(worst(robust, a.experts).max(), worst(robust, b.experts).max())
    # the step's reported imbalance is the worst scenario's
    assert max(res.imbalance_after) <= 1.10 + 1e-9


def test_equal_weights_are_no_weights(mixture):
    a, b = requests(mixture, 0, 8), requests(mixture, 8, 16)
    cur = solve("eplb", a, num_devices=4)
    cfg = RebalanceConfig(max_moves=8)
    p1, r1 = rebalance(cur, b.experts, cfg)
    p2, r2 = rebalance(cur, b.experts, cfg, np.full(b.num_tokens, 3.0))
    assert np.array_equal(p1.phy2log, p2.phy2log) and r1.lar_after == pytest.approx(r2.lar_after)
    with pytest.raises(InputError):
        rebalance(cur, b.experts, cfg, np.zeros(b.num_tokens))


def test_replay_gives_the_history_only_to_the_policy_that_keeps_one():
    cfg = ReplayConfig(ep=4, window=8, history=History(windows=3))
    assert cfg.span(POLICIES.get("sempar-incremental")) == 32
    assert cfg.span(POLICIES.get("eplb-periodic")) == 8      # the engines' EPLB: the window
    assert cfg.span(POLICIES.get("resolve")) == 8
