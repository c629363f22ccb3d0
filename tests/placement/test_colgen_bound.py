"""The column-generation bound (placement/colgen_bound.py, set_scan.py): the exact scan against
every set listed, the bound against the true optimum of tiny cases (every partition enumerated,
homes by an exact assignment, as test_device_bound does), and against the listed LP."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from sempar.placement.colgen_bound import ColgenConfig, colgen_bound, layer_rows, _scan
from sempar.placement.device_bound import BoundConfig, config_bound
from sempar.placement.set_scan import set_value

from test_device_bound import best_assignment, partitions, rows


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_set_value_is_the_top_C_sum_of_each_part(parts):
    N, G, batch = 10, 2, 40
    ex = rows(120, N, 3, 4, clustered=True)
    R = layer_rows(ex, N, G, batch=batch, parts=parts)
    assert R.C.size == parts and R.C.sum() == 3 * (batch // G)
    rng = np.random.default_rng(1)
    for _ in range(10):
        m = np.zeros(N, bool)
        m[rng.choice(N, N // G, replace=False)] = True
        h = m[ex].sum(axis=1)
        bounds = np.linspace(0, 3, parts + 1).round().astype(int) * batch   # runs of batches
        want = sum(np.sort(h[lo:hi])[::-1][: int(c)].sum()
                   for lo, hi, c in zip(bounds[:-1], bounds[1:], R.C))
        assert set_value(m, R.ptr, R.idx, R.count, R.part, R.C, R.M) == want


@pytest.mark.parametrize("N,G,cap,parts", [(8, 2, np.inf, 1), (10, 2, 1.1, 1), (12, 3, np.inf, 1),
                                           (12, 4, 1.2, 1), (10, 2, np.inf, 4), (12, 3, 1.2, 2)])
def test_exact_scan_finds_the_best_sets(N, G, cap, parts):
    S = N // G
    ex = rows(150, N, 3, N + G, clustered=True)
    R = layer_rows(ex, N, G, batch=40, parts=parts)
    rng = np.random.default_rng(N)
    mu = rng.normal(R.C.sum() * 1.2 / S, R.C.sum() / S / 3, N)
    cap = cap * R.load.sum() / G
    want = []
    for D in itertools.combinations(range(N), S):
        m = np.zeros(N, bool)
        m[list(D)] = True
        if R.load[m].sum() <= cap:
            want.append(set_value(m, R.ptr, R.idx, R.count, R.part, R.C, R.M) - mu[m].sum())
    want = np.sort(want)[::-1][:4]
    top, sets, exact, _ = _scan(R, S, mu, R.load, cap, 4, -np.inf, 10**9)
    assert exact
    assert np.allclose(top[: want.size], want)
    for v, s in zip(top, sets):
        m = np.zeros(N, bool)
        m[s] = True
        assert set_value(m, R.ptr, R.idx, R.count, R.part, R.C, R.M) - mu[m].sum() == pytest.approx(v)


@pytest.mark.parametrize("k,parts", [(5, 1), (6, 2)])
def test_exact_scan_with_full_levels(k, parts):
    """Rows of many experts on few devices fill levels 1, 2, ... early: the scan's sharper gain
    bound there (only rows holding >= L other experts of D gain) still finds the best sets."""
    N, G = 12, 3
    S = N // G
    ex = rows(150, N, k, 21 + k, clustered=True)
    R = layer_rows(ex, N, G, batch=40, parts=parts)
    mu = np.random.default_rng(k).normal(R.C.sum() * 1.5 / S, R.C.sum() / S / 3, N)
    want = []
    for D in itertools.combinations(range(N), S):
        m = np.zeros(N, bool)
        m[list(D)] = True
        want.append(set_value(m, R.ptr, R.idx, R.count, R.part, R.C, R.M) - mu[m].sum())
    want = np.sort(want)[::-1][:6]
    top, _, exact, _ = _scan(R, S, mu, R.load, np.inf, 6, -np.inf, 10**9)
    assert exact and np.allclose(top, want)


@pytest.mark.parametrize("nodes", [0, 1, 3, 20, 200])
def test_a_scan_out_of_nodes_still_bounds_the_best_set(nodes):
    """Out of nodes, the scan's best found with the bound of the subtrees it left open is
    still above the reduced cost of every set (brute force over all C(12, 4))."""
    N, G = 12, 3
    S = N // G
    ex = rows(150, N, 3, 9, clustered=True)
    R = layer_rows(ex, N, G, batch=40, parts=2)
    mu = np.random.default_rng(2).normal(R.C.sum() * 1.2 / S, R.C.sum() / S / 3, N)
    cap = 1.2 * R.load.sum() / G
    best = -np.inf
    for D in itertools.combinations(range(N), S):
        m = np.zeros(N, bool)
        m[list(D)] = True
        if R.load[m].sum() <= cap:
            best = max(best, set_value(m, R.ptr, R.idx, R.count, R.part, R.C, R.M) - mu[m].sum())
    top, sets, exact, open_ub = _scan(R, S, mu, R.load, cap, 2, -np.inf, nodes)
    assert max(top[0], open_ub) >= best - 1e-9
    assert exact == (open_ub == -np.inf)
    if exact:
        assert top[0] == pytest.approx(best)
    for v, s in zip(top, sets):             # what it did find are real sets, at their values
        if np.isfinite(v):
            m = np.zeros(N, bool)
            m[s] = True
            assert set_value(m, R.ptr, R.idx, R.count, R.part, R.C, R.M) - mu[m].sum() == \
                pytest.approx(v)


@pytest.mark.parametrize("G,k,seed,clustered,beta,parts", [
    (2, 3, 0, True, None, 1), (2, 3, 1, False, None, 1), (4, 3, 2, True, 1.3, 1),
    (4, 2, 3, False, None, 1), (2, 3, 7, True, 1.05, 1), (2, 3, 0, True, None, 4),
    (4, 3, 2, True, 1.3, 2)])
def test_bound_is_above_the_optimum_of_every_partition(G, k, seed, clustered, beta, parts):
    N, batch = 8, 12
    ex = rows(40, N, k, seed, clustered)
    count = np.bincount(ex.ravel(), minlength=N)
    ok = [p for p in partitions(tuple(range(N)), N // G)
          if beta is None or max(count[list(g)].sum() for g in p) <= beta * count.sum() / G]
    b = colgen_bound(ex, N, G, ColgenConfig(slack=0.0, parts=parts), beta, batch=batch)
    assert b is not None and b["proved"]
    if ok:
        assert b["local"] >= max(best_assignment(ex, p, batch) for p in ok) - 1e-9
    # fewer caps than batches are looser than the listed LP's cap a batch, never tighter; one
    # cap a batch (40 rows / 12: 4 batches) is the listed LP itself
    listed = config_bound(ex, N, G, BoundConfig(batch=batch), beta)
    assert b["local"] >= listed["local"] - 1e-6 * listed["local"]
    if parts == 4:
        assert b["local"] == pytest.approx(listed["local"], rel=1e-5)


@pytest.mark.parametrize("nodes", [0, 5, 50])
def test_scans_out_of_nodes_still_bound_the_optimum(nodes):
    N, G, batch = 8, 2, 12
    for seed in (5, 6):
        ex = rows(40, N, 3, seed, clustered=True)
        best = max(best_assignment(ex, p, batch) for p in partitions(tuple(range(N)), N // G))
        b = colgen_bound(ex, N, G, ColgenConfig(slack=0.0, max_nodes=nodes, starts=2),
                         batch=batch)
        assert b is not None and b["local"] >= best - 1e-9


def test_budget_stop_still_bounds():
    """Stopped after one scan, the Lagrangian bound at whatever prices it had is still valid."""
    N, G, batch = 8, 2, 12
    ex = rows(40, N, 3, 5, clustered=True)
    b = colgen_bound(ex, N, G, ColgenConfig(budget_s=0.0, slack=0.0), batch=batch)
    best = max(best_assignment(ex, p, batch) for p in partitions(tuple(range(N)), N // G))
    assert b is not None and b["scans"] == 1
    assert b["local"] >= best - 1e-9


@pytest.mark.parametrize("seed,beta,budget", [(0, None, 60.0), (7, 1.05, 60.0), (3, 1.3, 0.0)])
def test_floor_lowered_scans_bound_the_optimum(seed, beta, budget):
    """`slack_start`: scans from a high floor down; each finished one is a valid bound, the
    loop stopped by its budget (0: after the first scan) included."""
    N, G, batch = 8, 2, 12
    ex = rows(40, N, 3, seed, clustered=True)
    count = np.bincount(ex.ravel(), minlength=N)
    ok = [p for p in partitions(tuple(range(N)), N // G)
          if beta is None or max(count[list(g)].sum() for g in p) <= beta * count.sum() / G]
    cfg = ColgenConfig(budget_s=budget, slack=0.0, slack_start=0.4, parts=1)
    b = colgen_bound(ex, N, G, cfg, beta, batch=batch)
    assert b is not None
    if ok:
        assert b["local"] >= max(best_assignment(ex, p, batch) for p in ok) - 1e-9
    if budget > 0:      # down to slack 0: the LP's optimum, as one scan at slack 0 proves it
        assert b["proved"] and b["scans"] >= 2
        one = colgen_bound(ex, N, G, ColgenConfig(slack=0.0, parts=1), beta, batch=batch)
        assert b["local"] == pytest.approx(one["local"], rel=1e-6)


def _two_layers(N: int, k: int = 3):
    """(a 2-layer trace of 48 clustered rows, its experts int[T, 2, k])."""
    from sempar.trace.schema import RoutingTrace, TraceMeta

    ex = np.stack([rows(48, N, k, s, clustered=True) for s in (11, 12)], axis=1)   # [T, 2, k]
    T = ex.shape[0]
    trace = RoutingTrace(TraceMeta(model="t", num_layers=2, num_experts=N, top_k=k, vocab_size=4),
                         np.zeros(T, np.int32), np.zeros(T, np.int64),
                         np.arange(T, dtype=np.int32), ex.astype(np.int16)).validate()
    return trace, ex


def test_lar_upper_bound_runs_the_large_colgen_beside_the_row_pair_bound():
    from sempar.placement.bound import COLGEN_METHOD, lar_upper_bound

    N, G, batch = 10, 2, 16
    trace, ex = _two_layers(N)
    # C(10, 5) = 252 above both listed sizes: the row-pair bound and the anytime colgen
    cfg = BoundConfig(batch=batch, max_device_sets=10, colgen_max_sets=100,
                      colgen_large=ColgenConfig(parts=1, slack_start=0.3, slack=0.0))
    b = lar_upper_bound(trace, G, cfg)
    without = lar_upper_bound(trace, G, BoundConfig(batch=batch, max_device_sets=10,
                                                    colgen_max_sets=100, colgen_large=None))
    spent = lar_upper_bound(trace, G, replace(cfg, colgen_large_total_s=0.0))
    assert COLGEN_METHOD in b["per_layer_method"]
    assert COLGEN_METHOD not in without["per_layer_method"]
    assert spent["per_layer"] == without["per_layer"]          # no CPU budget: not run
    for l in range(2):
        best = max(best_assignment(ex[:, l], p, batch) for p in partitions(tuple(range(N)), N // G))
        assert b["per_layer"][l] >= best / ex[:, l].size - 1e-12
        assert b["per_layer"][l] <= without["per_layer"][l] + 1e-12     # the least kept


def test_lar_upper_bound_uses_it_between_the_listed_and_the_scanned_sizes():
    from sempar.placement.bound import COLGEN_METHOD, lar_upper_bound

    N, G, batch = 10, 2, 16
    trace, ex = _two_layers(N)
    cfg = BoundConfig(batch=batch, max_device_sets=10, colgen_max_sets=10_000)
    b = lar_upper_bound(trace, G, cfg)
    assert b["per_layer_method"] == [COLGEN_METHOD] * 2
    for l in range(2):
        best = max(best_assignment(ex[:, l], p, batch) for p in partitions(tuple(range(N)), N // G))
        assert b["per_layer"][l] >= best / ex[:, l].size - 1e-12
    listed = lar_upper_bound(trace, G, BoundConfig(batch=batch))   # C(10, 5) = 252 listed
    assert b["lar_mean"] >= listed["lar_mean"] - 1e-9


def test_evaluate_bound_effort_picks_the_bounds_it_runs():
    """`evaluate --bound`: fast skips the column generation (the listed LP and the pair budget
    only), full runs it where the sets cannot be listed, none leaves the bound rows out."""
    from sempar.placement.bound import COLGEN_METHOD
    from sempar.placement.device_bound import BOUND_EFFORTS
    from sempar.schedule.evaluate import evaluate
    from sempar.schedule.optimality import BOUND_REF
    from sempar.trace.schema import RoutingTrace, TraceMeta

    N, G, k, T = 10, 2, 3, 64
    ex = rows(T, N, k, 4, clustered=True)[:, None]
    trace = RoutingTrace(TraceMeta(model="t", num_layers=1, num_experts=N, top_k=k, vocab_size=4),
                         np.zeros(T, np.int32), np.arange(T) // 8,
                         np.arange(T, dtype=np.int32) % 8, ex.astype(np.int16)).validate()
    assert BOUND_EFFORTS["fast"].colgen_max_sets == 0 and BOUND_EFFORTS["none"] is None
    assert BOUND_EFFORTS["fast"].colgen_large is None
    small = dict(batch=16, max_device_sets=10)
    got = {}
    for name, cfg in (("fast", BoundConfig(colgen_max_sets=0, colgen_large=None, **small)),
                      ("full", BoundConfig(colgen_max_sets=10_000, **small)), ("none", None)):
        refs = evaluate(trace, trace, G, methods=["sempar"], bound=cfg)["refs"]
        got[name] = refs.get(BOUND_REF)
    assert got["none"] is None
    assert COLGEN_METHOD not in got["fast"]["bound"] and COLGEN_METHOD in got["full"]["bound"]
    assert got["full"]["lar_mean"] <= got["fast"]["lar_mean"] + 1e-12    # the least kept
    assert got["full"]["lar_mean"] >= got["full"]["sempar_in_sample"] - 1e-12
