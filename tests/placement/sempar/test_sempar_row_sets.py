"""The rows objective's fast tp path (placement/sempar/row_sets.py) and the optimality bound
(placement/bound.py, schedule/optimality.py), on the planted row clusters of
test_sempar_rows.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sempar.placement import Placement
from sempar.placement.base import PlacementProblem
from sempar.placement.bound import budget_rows, coactivation, eigen_bound, lar_upper_bound, \
    star_bound
from sempar.placement.sempar.config import SemparConfig
from sempar.placement.sempar.row_sets import layer_trace, set_ids
from sempar.placement.sempar.rows import row_trace
from sempar.placement.sempar.solver import sempar_solve
from sempar.schedule.evaluate import evaluate
from sempar.schedule.optimality import BOUND_REF, IN_SAMPLE_REF
from sempar.trace import split_by_request

from test_sempar_rows import G, L, N, exact, row_planted


@pytest.fixture(scope="module")
def planted():
    trace, ecl = row_planted(T=6_000, R=120)
    return trace, Placement(np.stack([np.argsort(ecl[l], kind="stable") for l in range(L)]), N, G)


def test_set_ids_name_each_distinct_set_once():
    ex = np.array([[3, 1], [1, 3], [2, 5], [5, 2], [1, 2]])
    ids = set_ids(ex)
    assert ids[0] == ids[1] and ids[2] == ids[3] and len(set(ids.tolist())) == 3


def test_layer_trace_counts_rows_per_set(planted):
    trace, _ = planted
    rows = row_trace(trace, 10**9, 0)
    lt = layer_trace(rows, 1)
    assert lt.meta.num_layers == 1 and lt.num_tokens == trace.num_tokens
    assert np.array_equal(lt.experts[:, 0], trace.experts[:, 1])
    # rows of one token id share their expert set, and the ids are as many as the sets
    key = [tuple(sorted(r)) for r in trace.experts[:, 1].tolist()]
    assert lt.meta.vocab_size == len(set(key))
    for t in range(0, trace.num_tokens, 97):
        assert key[t] == key[int(np.flatnonzero(lt.token_id == lt.token_id[t])[0])]


def test_fast_path_matches_the_row_path_and_is_deterministic(planted):
    trace, plant = planted
    fit, ev = split_by_request(trace, seed=0)
    p = PlacementProblem(fit, G, objective="rows", max_imbalance=1.2)
    new = sempar_solve(p, SemparConfig(row_sets=True))
    again = sempar_solve(PlacementProblem(fit, G, objective="rows", max_imbalance=1.2, jobs=1),
                         SemparConfig(row_sets=True))
    old = sempar_solve(p, SemparConfig(row_sets=False))
    assert np.array_equal(new.phy2log, again.phy2log)          # same seed: same placement
    best = exact(plant, ev)["lar_mean"]
    assert exact(new, ev)["lar_mean"] >= exact(old, ev)["lar_mean"] - 0.01
    assert exact(new, ev)["lar_mean"] >= 0.9 * best
    assert new.info["row_sets"] and max(new.info["row_sets"]) <= N * (N - 1) // 2


def test_budget_rows_buys_cheapest_levels_first():
    assert budget_rows(10, 0, 4) == 10               # every row keeps 1 local
    assert budget_rows(10, 10, 4) == 20              # 1 -> 2 costs 1 pair a row
    assert budget_rows(10, 15, 4) == 22.5            # then 2 -> 3 at 2 pairs a row
    assert budget_rows(10, 1e9, 3) == 30             # at most min(k, S)


def test_pair_bounds_hold_for_every_partition_of_a_small_case():
    rng = np.random.default_rng(1)
    n, g, s = 6, 2, 3
    ex = np.stack([rng.choice(n, 3, replace=False) for _ in range(200)])
    A = coactivation(ex, n)
    best = 0.0
    for first in itertools.combinations(range(n), s):
        dev = np.isin(np.arange(n), first)
        best = max(best, float(A[np.ix_(dev, dev)].sum() + A[np.ix_(~dev, ~dev)].sum()) / 2)
    assert star_bound(A, s) >= best - 1e-6 and eigen_bound(A, g) >= best - 1e-6


def test_bound_is_above_every_placement(planted):
    trace, plant = planted
    b = lar_upper_bound(trace, G)
    assert exact(plant, trace)["lar_mean"] <= b["lar_mean"] <= 1.0
    rng = np.random.default_rng(0)
    for _ in range(5):
        rnd = Placement(np.stack([rng.permutation(N) for _ in range(L)]), N, G)
        assert exact(rnd, trace)["lar_mean"] <= b["lar_mean"]


def test_evaluate_reports_the_bound_and_the_gap(planted):
    trace, _ = planted
    fit, ev = split_by_request(trace, seed=0)
    from sempar.solve_options import SolveOptions

    out = evaluate(fit, ev, G, SolveOptions(objective="rows", max_imbalance=1.2),
                   methods=["sempar", "vanilla"])
    bound = out["refs"][BOUND_REF]
    assert "bound" in BOUND_REF and 0 < bound["gap"] <= 1.0
    assert out["refs"][IN_SAMPLE_REF]["lar_mean"] == pytest.approx(bound["sempar_in_sample"])
