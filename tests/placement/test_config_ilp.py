"""The integer device-configuration program (placement/config_ilp.py): its bound against the true
optimum of tiny cases (every partition enumerated, homes by an exact assignment), its
partition against the best sum of V over every partition, and `tighten_bound` keeping the
least of the bounds."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.placement.config_ilp import (INTEGER_METHOD, ConfigIlpConfig, expert_devices,
                                         integer_config, layer_local, listable, tighten_bound)
from sempar.placement.device_bound import BoundConfig, config_bound, device_sets, device_values
from test_device_bound import best_assignment, partitions, rows


@pytest.mark.parametrize("G,k,seed,clustered", [(2, 3, 0, True), (2, 3, 1, False),
                                                (4, 3, 2, True), (4, 2, 3, False)])
def test_integer_bound_is_above_every_partition_and_below_the_lp(G, k, seed, clustered):
    N, batch = 8, 12
    ex = rows(40, N, k, seed, clustered)
    cfg = ConfigIlpConfig(batch=batch)
    r = integer_config(ex, N, G, cfg)
    every = list(partitions(tuple(range(N)), N // G))
    best = max(best_assignment(ex, p, batch) for p in every)
    assert r["optimal"] and r["local"] >= best - 1e-9
    assert r["local"] <= config_bound(ex, N, G, BoundConfig(batch=batch))["local"] + 1e-5
    # the MILP's partition is the best sum of V over every partition, and its value is that sum
    D = device_sets(N, N // G)
    V = dict(zip(map(tuple, D.tolist()), device_values(ex, N, G, batch, D)))
    sums = [sum(V[tuple(sorted(g))] for g in p) for p in every]
    assert r["value"] == pytest.approx(max(sums))
    part = r["partition"].reshape(G, N // G)
    assert sorted(r["partition"].tolist()) == list(range(N))
    assert sum(V[tuple(sorted(g))] for g in part.tolist()) == pytest.approx(r["value"])
    # the real figure of the partition (proposal-round homes) is below the bound
    assert layer_local(expert_devices(r["partition"], G), ex, G, batch) <= r["local"] + 1e-9


@pytest.mark.parametrize("G,beta", [(2, 1.02), (4, 1.1), (4, 1.3)])
def test_balanced_integer_bound_is_above_every_balanced_partition(G, beta):
    N, batch = 8, 12
    ex = rows(60, N, 3, 7, clustered=True)
    count = np.bincount(ex.ravel(), minlength=N)
    ok = [p for p in partitions(tuple(range(N)), N // G)
          if max(count[list(g)].sum() for g in p) <= beta * count.sum() / G]
    r = integer_config(ex, N, G, ConfigIlpConfig(batch=batch), max_imbalance=beta)
    if not ok:
        assert r is None                        # no balanced partition: nothing to bound
        return
    assert r["local"] >= max(best_assignment(ex, p, batch) for p in ok) - 1e-9
    loads = [count[g].sum() for g in r["partition"].reshape(G, -1)]
    assert max(loads) <= beta * count.sum() / G + 1e-9


def test_too_many_device_sets_are_not_listed():
    assert listable(32, 8) and not listable(32, 4) and not listable(30, 4)
    assert integer_config(rows(20, 32, 4, 0, False), 32, 4) is None


def test_tighten_bound_keeps_the_least_and_says_which():
    N, G, L, batch = 8, 4, 2, 12
    ex = np.stack([rows(50, N, 3, s, clustered=True) for s in (4, 5)], axis=1)   # [T, L, k]
    lp = [config_bound(ex[:, l], N, G, BoundConfig(batch=batch)) for l in range(L)]
    T = ex.shape[0]
    before = {"per_layer": [b["local"] / (T * 3) for b in lp],
              "witness": [b["witness"] for b in lp],
              "per_layer_method": ["lp"] * L, "seconds": [0.0] * L, "lar_mean": 0.0,
              "method": "lp", "lar_mean_any_balance": 1.0}
    out = tighten_bound(ex, N, G, before, ConfigIlpConfig(batch=batch))
    assert out["lp_per_layer"] == before["per_layer"]
    for l in range(L):
        assert out["per_layer"][l] <= before["per_layer"][l]
        best = max(best_assignment(ex[:, l], p, batch) for p in partitions(tuple(range(N)), 2))
        assert out["per_layer"][l] >= best / (T * 3) - 1e-12
        assert out["milp_gap"][l] is not None
    assert out["lar_mean"] == pytest.approx(np.mean(out["per_layer"]))
    assert set(out["method"].split(" + ")) == set(out["per_layer_method"]) <= {"lp", INTEGER_METHOD}
