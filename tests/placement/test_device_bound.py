"""The device-configuration bound (placement/device_bound.py): V(D) against a direct count, the
bound against the true optimum of tiny cases (every partition enumerated, homes by an exact
assignment), and against sempar's in-sample figure on real routing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from sempar.paths import real_trace_path
from sempar.placement import Placement
from sempar.placement.base import PlacementProblem
from sempar.placement.bound import CONFIG_METHOD, lar_upper_bound
from sempar.placement.capacity import equal_shares
from sempar.placement.device_bound import BoundConfig, config_bound, device_sets, device_values
from sempar.placement.metrics import placement_figures
from sempar.placement.sempar.solver import sempar_solve
from sempar.schedule.homes import oracle_home
from sempar.schedule.optimality import BOUND_REF, optimality_refs
from sempar.trace import read_trace


def rows(T: int, N: int, k: int, seed: int, clustered: bool) -> np.ndarray:
    """int64[T, k] distinct experts a row; `clustered`: most rows drawn near one of two blocks."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(T):
        if clustered and rng.random() < 0.7:
            block = rng.permutation(N)[: N // 2] if rng.random() < 0.2 else \
                np.arange(N // 2) + (N // 2) * rng.integers(2)
            out.append(rng.choice(block, k, replace=False))
        else:
            out.append(rng.choice(N, k, replace=False))
    return np.array(out, np.int64)


def best_assignment(ex: np.ndarray, groups: list, batch: int) -> float:
    """The most local activations any equal-shares home assignment gets for this partition:
    per batch an exact assignment of rows to the devices' share slots."""
    dev = np.empty(sum(len(g) for g in groups), np.int64)
    for d, g in enumerate(groups):
        dev[list(g)] = d
    G, total = len(groups), 0.0
    for lo in range(0, ex.shape[0], batch):
        e = ex[lo:lo + batch]
        hits = np.stack([(dev[e] == d).sum(axis=1) for d in range(G)], axis=1)  # [n, G]
        slots = np.repeat(np.arange(G), equal_shares(e.shape[0], G))
        r, c = linear_sum_assignment(-hits[:, slots])
        total += float(hits[r, slots[c]].sum())
    return total


def partitions(items: tuple, S: int):
    """Every partition of `items` into blocks of S (the block with the first item first)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for mates in itertools.combinations(rest, S - 1):
        left = tuple(x for x in rest if x not in mates)
        for tail in partitions(left, S):
            yield [(first, *mates), *tail]


def test_device_values_match_a_direct_count():
    N, G, k, batch = 8, 2, 3, 16
    ex = rows(50, N, k, 3, clustered=True)
    D = device_sets(N, N // G)
    V = device_values(ex, N, G, batch, D)
    for j in range(0, D.shape[0], 7):
        hit = np.isin(ex, D[j]).sum(axis=1)
        want = sum(np.sort(hit[lo:lo + batch])[::-1][: -(-hit[lo:lo + batch].size // G)].sum()
                   for lo in range(0, ex.shape[0], batch))
        assert V[j] == want


@pytest.mark.parametrize("G,k,seed,clustered", [(2, 3, 0, True), (2, 3, 1, False),
                                                (4, 3, 2, True), (4, 2, 3, False)])
def test_bound_is_above_the_optimum_of_every_partition(G, k, seed, clustered):
    N, batch = 8, 12
    ex = rows(40, N, k, seed, clustered)
    b = config_bound(ex, N, G, BoundConfig(batch=batch))
    best = max(best_assignment(ex, p, batch) for p in partitions(tuple(range(N)), N // G))
    assert b["local"] >= best - 1e-9
    assert b["local"] <= ex.size


@pytest.mark.parametrize("G,beta", [(2, 1.02), (4, 1.1), (4, 1.3)])
def test_balanced_bound_is_above_the_optimum_of_every_balanced_partition(G, beta):
    N, batch = 8, 12
    ex = rows(60, N, 3, 7, clustered=True)
    count = np.bincount(ex.ravel(), minlength=N)
    cap = beta * count.sum() / G
    ok = [p for p in partitions(tuple(range(N)), N // G)
          if max(count[list(g)].sum() for g in p) <= cap]
    b = config_bound(ex, N, G, BoundConfig(batch=batch), max_imbalance=beta)
    if not ok:                                  # no balanced partition: nothing to bound
        return
    best = max(best_assignment(ex, p, batch) for p in ok)
    assert b["local"] >= best - 1e-9
    assert b["local"] <= config_bound(ex, N, G, BoundConfig(batch=batch))["local"] + 1e-9


def test_layer_bound_is_above_the_capacity_bound_oracle_of_random_placements():
    N, G, k = 8, 4, 3
    ex = rows(300, N, k, 5, clustered=True)
    b = config_bound(ex, N, G)["local"] / ex.size
    rng = np.random.default_rng(0)
    for _ in range(20):
        pl = Placement(rng.permutation(N)[None, :], N, G)
        e3 = ex[:, None, :]
        assert placement_figures(pl, e3, oracle_home(pl, e3))["lar_mean"] <= b + 1e-12


def test_too_many_device_sets_leave_the_pair_budget():
    ex = rows(20, 8, 3, 0, clustered=False)
    assert config_bound(ex, 8, 2, BoundConfig(max_device_sets=10)) is None


def test_real_routing_bound_is_above_sempar_in_sample():
    trace = read_trace(real_trace_path("gpt-oss-20b"))
    trace = trace.take(np.arange(4096))
    G = 8
    placement = sempar_solve(PlacementProblem(trace, G, objective="rows"))
    ins = placement_figures(placement, trace.experts, oracle_home(placement, trace.experts))
    b = lar_upper_bound(trace, G)
    assert set(b["per_layer_method"]) == {CONFIG_METHOD}      # C(32, 4) device sets: enumerated
    assert np.all(np.asarray(ins["lar"]) <= np.asarray(b["per_layer"]) + 1e-12)
    assert b["lar_mean"] < 0.9                 # and far below the trivial 1.0
    refs = optimality_refs(trace, G, placement, 1.05)[BOUND_REF]
    assert refs["max_imbalance"] >= 1.05 and refs["bound_any_balance"] == b["lar_mean"]
    assert ins["lar_mean"] <= refs["best_known_in_sample"] <= refs["lar_mean"] <= b["lar_mean"]
    assert refs["gap"] == pytest.approx(ins["lar_mean"] / refs["lar_mean"])
