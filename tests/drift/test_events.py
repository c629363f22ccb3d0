"""sempar-incremental's switch test and event updates (drift/events.py), the regime window of
the history, the water-filled split (dispatch_peak.fill_loads) behind the replica pass above 16
devices and rebalance's bound after dispatch; on the shipped real DeepSeek-V2-Lite ESFT trace
where a stream is needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sempar
from sempar.drift.events import Events, detect, request_histograms, switch_score
from sempar.drift.history import (History, batch_loads, history_rows, resample_loads,
                                  window_loads)
from sempar.drift.streams import drift_stream, request_table
from sempar.errors import InputError
from sempar.placement.dispatch_peak import ReplicaPass, fill_loads, min_peak, replica_pass
from sempar.placement.placement import Placement
from sempar.placement.rebalance import RebalanceConfig, rebalance

ESFT = Path(sempar.__file__).parent / "assets" / "traces" / "deepseek-v2-lite-esft.parquet"


@pytest.fixture(scope="module")
def tasks():
    from sempar.trace import read_trace

    stream = drift_stream(read_trace(ESFT, optional=("domain",)), "tasks")
    _, dom, _, _ = request_table(stream)
    return stream, dom, request_histograms(stream)


def test_histograms_count_every_activation_per_request(tasks):
    stream, _, hist = tasks
    _, _, rows, starts = request_table(stream)
    assert hist.shape == (starts.size - 1, stream.experts.shape[1], stream.meta.num_experts)
    assert hist.sum() == stream.experts.size
    first = stream.experts[rows[starts[0]:starts[1]]]
    assert np.array_equal(hist[0, 3], np.bincount(first[:, 3].ravel(), minlength=hist.shape[2]))


def test_the_switch_to_a_new_task_is_found_at_its_first_request(tasks):
    """intent -> law: the first law request scores far above the window's own spread; inside
    the intent stretch no request reaches the threshold."""
    _, dom, hist = tasks
    cfg = Events()
    rng = np.random.default_rng(0)
    first_law = int(np.flatnonzero(dom == dom[-20])[0])          # the law task's first request
    assert dom[first_law - 1] != dom[first_law]
    assert detect(hist, first_law, 1, 16, cfg, rng) == 1
    quiet = [detect(hist, r, 8, 16, cfg, rng) for r in range(40, 100)]
    assert sum(quiet) == 0
    assert switch_score(hist, 5, 1, 16, rng, 10) == 0.0            # no full window before it
    assert detect(hist, first_law, 0, 16, cfg, rng) == 0           # nothing served since update
    with pytest.raises(InputError):
        Events(threshold=0.0)


def test_the_block_null_stays_quiet_inside_mmlu_groups_where_random_subsets_fire():
    """GPT-OSS-20B MMLU groups stream (subjects in runs of a few requests inside each group):
    the block null (`Events.blocks()`) fires nowhere inside a group and still at the switch
    to STEM (request 344); the default random-subset null fires inside groups."""
    from sempar.trace import read_trace

    mmlu = Path(sempar.__file__).parent / "assets" / "traces" / "gpt-oss-20b-mmlu.parquet"
    stream = drift_stream(read_trace(mmlu, optional=("domain",)), "groups")
    _, dom, _, _ = request_table(stream)
    hist = request_histograms(stream)
    switches = np.flatnonzero(dom[1:] != dom[:-1]) + 1

    def fired(cfg, hi):
        rng, out = np.random.default_rng(0), []
        for r in range(32, hi):
            c = detect(hist, r, 8, 32, cfg, rng)
            if c:
                out.append(r)
        return out

    def inside(rs):                   # no switch in the block's reference window or the block
        return [r for r in rs if not ((switches > r - 8 - 32) & (switches <= r)).any()]

    new, old = fired(Events.blocks(), 360), fired(Events(), 126)    # old: the first group
    assert inside(new) == [] and len(inside(old)) >= 2
    assert any(344 <= r < 344 + 8 for r in new)
    assert Events() == Events.subsets() and Events.blocks().threshold == 1.9
    with pytest.raises(InputError):
        Events(null="halves")


def test_a_regime_is_window_zero_and_the_windows_before_it_count_back_from_it(tasks):
    stream, _, _ = tasks
    _, _, rows, starts = request_table(stream)
    seen = stream.take(rows[starts[0]:starts[20]])
    _, age = history_rows(seen, 8, History(windows=2), regime=3)
    _, _, r2, s2 = request_table(seen)
    per_req = np.array([age[r2[s2[r]]] for r in range(20)])
    assert per_req.tolist() == [3] + [2] * 8 + [1] * 8 + [0] * 3
    _, plain = history_rows(seen, 8, History(windows=2))
    assert not np.array_equal(age, plain)


def test_fill_loads_is_a_feasible_split_at_or_above_the_exact_peak():
    rng = np.random.default_rng(3)
    G, N = 4, 12
    row = np.concatenate([np.arange(N), rng.choice(N, G, replace=False)])   # one spare each
    rng.shuffle(row)
    load = rng.integers(0, 100, (3, N)).astype(float)
    f = fill_loads(row, load, G)
    assert np.allclose(f.sum(axis=1), load.sum(axis=1))                  # every load served
    assert np.all(f.max(axis=1) / f.mean(axis=1) >= min_peak(row, load, G) - 1e-9)
    single = np.arange(N)                                                # no replicas
    dev = np.bincount(single // (N // G), load[0], minlength=G)
    assert np.allclose(fill_loads(single, load[:1], G)[0], dev)


def test_replica_pass_runs_above_16_devices():
    """The exact bound stops at 16 devices; above it the pass water-fills instead of being
    skipped: a hot expert gets a second copy."""
    G, N = 32, 64
    row = np.concatenate([np.arange(N).reshape(G, 2), np.arange(G)[:, None]], axis=1).ravel()
    load = np.ones((1, 1, N))
    load[0, 0, 40] = 30.0                                                # one hot expert
    before = fill_loads(row, load[0], G)
    new, moved = replica_pass(row[None], G, load, np.array([1.0]), ReplicaPass(max_moves=2))
    after = fill_loads(new[0], load[0], G)
    assert moved >= 1 and after.max() < before.max()
    assert np.bincount(new[0], minlength=N).min() >= 1                  # every expert kept


def test_rebalance_bound_after_dispatch_sees_what_a_replica_buys():
    """A hot expert with two copies: the nearest copy serves it all from one device (above
    the bound), a balancing dispatch splits it (within): with `split` no balance move is
    needed (the nearest rule sees an overload no move can cut)."""
    G, N = 2, 5
    phy = np.array([[0, 1, 2, 0, 3, 4]])            # expert 0 on both devices (the spare)
    p = Placement(phy, N, G, np.zeros(G, np.int64), "test", {}).validate()
    rng = np.random.default_rng(0)
    hot = rng.random(400) < 0.6                     # rows (0, 1): homed on device 0
    ex = np.where(hot[:, None], [0, 1], [3, 4])[:, None, :]
    near = rebalance(p, ex, RebalanceConfig(max_imbalance=1.05, max_moves=4))[1]
    split = rebalance(p, ex, RebalanceConfig(max_imbalance=1.05, max_moves=4, split=True))[1]
    assert max(near.imbalance_before) > 1.05                      # 0 served near its home
    assert max(split.imbalance_before) < 1.05                     # split over its copies


@pytest.mark.slow
def test_replay_updates_inside_the_step_of_a_switch_and_counts_its_copies(tasks):
    """intent -> law inside a step: sempar-incremental updates there (an event), its copies
    counted in that step; with the switch test off it updates before steps only."""
    from dataclasses import replace

    from sempar.drift.config import ReplayConfig
    from sempar.drift.costs import expert_bytes
    from sempar.drift.replay import replay
    from sempar.solve_options import SolveOptions

    stream, dom, _ = tasks
    _, _, rows, starts = request_table(stream)
    law = int(np.flatnonzero(dom == dom[-20])[0])
    part = stream.take(rows[starts[law - 40]:starts[law + 20]])          # switch at request 40
    cfg = ReplayConfig.for_model(stream.meta.model, 4, solve=SolveOptions(jobs=1, redundant=4),
                                 rebalance=dict(max_moves=8), every=16, window=16,
                                 max_steps=3, dispatch="lp-cap",
                                 events=Events(max_moves=16, replica_moves=2))
    on = replay(part, ["sempar-incremental"], cfg)["policies"]["sempar-incremental"]
    off = replay(part, ["sempar-incremental"], replace(cfg, events=Events(enabled=False))
                 )["policies"]["sempar-incremental"]
    assert off["events"] == 0 and on["events"] >= 1
    step = [s for s in on["steps"] if s["events"]][0]
    assert step["first_request"] <= 40 < step["first_request"] + step["requests"]
    assert step["migrated_bytes"] == step["migrated_experts"] * expert_bytes(stream.meta.model)
    assert step["migrated_experts"] > [s for s in off["steps"]][step["step"]]["migrated_experts"]


def test_batch_scenarios_split_each_window_into_its_dispatch_batches(tasks):
    """`batch_loads`: every window's batches sum to its `window_loads` total, each batch at
    most `batch` rows, their ages those of their windows (oldest first)."""
    stream, _, _ = tasks
    _, _, rows, starts = request_table(stream)
    seen = stream.take(rows[starts[0]:starts[40]])
    w, wa = window_loads(seen, 10, History())
    b, ba = batch_loads(seen, 10, History(), 512)
    assert np.all(np.diff(ba) <= 0) and set(ba.tolist()) == set(wa.tolist())
    for i, a in enumerate(wa):
        assert np.allclose(b[:, ba == a].sum(axis=1), w[:, i])
        assert (ba == a).sum() == -(-int(w[0, i].sum()) // (512 * seen.experts.shape[2]))
    assert b[0].sum(axis=1).max() <= 512 * seen.experts.shape[2]


def test_resample_scenarios_draw_whole_requests_of_the_youngest_window(tasks):
    """`resample_loads`: each draw is a sum of whole requests of the youngest window (as many
    as it holds), so every draw's per-layer total is a multiple-request sum; seeded; a window
    of one request gives that request's load in every draw."""
    stream, _, _ = tasks
    _, _, rows, starts = request_table(stream)
    seen = stream.take(rows[starts[0]:starts[40]])
    w, wa = window_loads(seen, 10, History())
    b = resample_loads(seen, 10, History(), 6, seed=3)
    L, N = seen.experts.shape[1], seen.meta.num_experts
    assert b.shape == (L, 6, N)
    assert np.array_equal(b, resample_loads(seen, 10, History(), 6, seed=3))
    assert not np.array_equal(b, resample_loads(seen, 10, History(), 6, seed=4))
    sizes = np.diff(starts[30:41]) * seen.experts.shape[2]     # the window: requests 30-39
    for d in range(6):                    # a draw's total: 10 request sizes, with repeats
        tot = int(b[0, d].sum())
        assert tot >= 10 * sizes.min() and tot <= 10 * sizes.max()
    assert not np.allclose(b[:, 0], b[:, 1])
    one = stream.take(rows[starts[0]:starts[11]])                # window 0: the last request
    b1 = resample_loads(one, 1, History(), 3, seed=0)
    w1, a1 = window_loads(one, 1, History())
    assert np.array_equal(b1, np.repeat(w1[:, a1 == 0], 3, axis=1))


def test_replay_config_refuses_an_unknown_replica_scenario():
    from sempar.drift.config import ReplayConfig

    with pytest.raises(InputError, match="replica scenarios"):
        ReplayConfig(ep=4, replica_scenarios="steps")
    with pytest.raises(InputError, match="resamples"):
        ReplayConfig(ep=4, young_resamples=-1)


@pytest.mark.slow
def test_warm_start_updates_before_step_0_and_counts_its_copies(tasks):
    """`ReplayConfig.warm_start`: sempar-incremental updates once on the warm-up window (its
    replica slots retargeted for the dispatch's peak), the copies counted in step 0; without
    it step 0 is served on the start solve as is."""
    from sempar.drift.config import ReplayConfig
    from sempar.drift.replay import replay
    from sempar.solve_options import SolveOptions

    stream, _, _ = tasks
    _, _, rows, starts = request_table(stream)
    part = stream.take(rows[starts[0]:starts[24]])
    cfg = ReplayConfig.for_model(stream.meta.model, 4, solve=SolveOptions(jobs=1, redundant=4),
                                 rebalance=dict(max_moves=4), every=8, window=16, max_steps=1,
                                 dispatch="lp-cap", events=Events(enabled=False, max_moves=4))
    on = replay(part, ["sempar-incremental"], cfg)["policies"]["sempar-incremental"]["steps"][0]
    off = replay(part, ["sempar-incremental"], cfg.with_(warm_start=False)
                 )["policies"]["sempar-incremental"]["steps"][0]
    assert off["migrated_experts"] == 0 and not off["updated"]
    assert on["migrated_experts"] > 0 and not on["updated"]
    assert on["solve_s"] > 0.0


def test_young_stream_updates_get_the_event_budget():
    """`ReplayConfig.young_budget`: a step update while the stream is younger than the
    history's span runs at the event budget (moves and replica slots), `young_cap` its bound."""
    from sempar.drift.config import ReplayConfig
    from sempar.drift.replay import _young_config

    cfg = ReplayConfig.for_model("deepseek-v2-lite", 4, rebalance=dict(max_moves=8),
                                 events=Events(max_moves=100, replica_moves=3))
    y = _young_config(cfg)
    assert (y.rebalance.max_moves, y.replicas.max_moves) == (100, 3)
    assert y.rebalance.max_imbalance == cfg.rebalance.max_imbalance
    assert _young_config(cfg.with_(young_cap=1.02)).rebalance.max_imbalance == 1.02
    assert cfg.young_budget and not ReplayConfig(ep=4, young_budget=False).young_budget


@pytest.mark.slow
def test_replica_pass_counts_locality_on_the_youngest_window_only_when_asked(tasks, monkeypatch):
    """`ReplicaPass.locality`: sempar-incremental hands the replica pass the youngest window's
    kept rows (the tokens it counts local activations on), and none when the knob is 0."""
    from dataclasses import replace

    from sempar.drift import policies
    from sempar.drift.config import ReplayConfig
    from sempar.drift.history import history_sample
    from sempar.drift.policies import solve_window
    from sempar.solve_options import SolveOptions

    stream, _, _ = tasks
    _, _, rows, starts = request_table(stream)
    seen = stream.take(rows[starts[0]:starts[24]])
    cfg = ReplayConfig.for_model(stream.meta.model, 4, solve=SolveOptions(jobs=1, redundant=4),
                                 rebalance=dict(max_moves=2), window=8, dispatch="lp-cap",
                                 history=History(rows=256, older_rows=64))
    start = solve_window("eplb", seen, cfg)
    got = []
    monkeypatch.setattr(policies, "replica_pass",
                        lambda phy, G, *a, tokens=None, **k: (got.append(tokens), (phy, 0))[1])
    policies._incremental(start, seen, cfg)
    policies._incremental(start, seen, cfg.with_(replicas=replace(cfg.replicas,
                                                                  locality=0.01)))
    keep, _, age = history_sample(seen, 8, cfg.history)
    assert got[0] is None
    assert np.array_equal(got[1], seen.experts[keep[age == 0]])
    assert 0 < got[1].shape[0] <= 256
