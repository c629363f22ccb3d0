"""The row-pair Lagrangian bound (placement/row_pair_bound.py): c(m) against every composition,
the bound against the true optimum of tiny cases (every partition enumerated, each row on its
best block), and against the pair budget it refines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sempar.placement.bound import layer_bound
from sempar.placement.row_pair_bound import RowPairConfig, min_pairs, row_pair_bound
from test_device_bound import partitions, rows


@pytest.mark.parametrize("k,G,S", [(6, 8, 8), (6, 4, 16), (3, 4, 2), (4, 2, 4), (4, 4, 2)])
def test_min_pairs_is_the_fewest_over_every_composition(k, G, S):
    ms, cs = min_pairs(k, G, S)
    want = {}
    for h in itertools.product(range(min(k, S) + 1), repeat=G):
        if sum(h) == k:
            m = max(h)
            p = sum(x * (x - 1) // 2 for x in h)
            want[m] = min(want.get(m, p), p)
    assert dict(zip(ms.tolist(), cs.tolist())) == want


def best_unconstrained(ex: np.ndarray, N: int, S: int) -> float:
    """max over every partition into blocks of S of sum_t max_d |S_t ∩ P_d|."""
    best = 0.0
    for part in partitions(tuple(range(N)), S):
        dev = np.empty(N, np.int64)
        for d, g in enumerate(part):
            dev[list(g)] = d
        hits = np.stack([(dev[ex] == d).sum(axis=1) for d in range(len(part))], axis=1)
        best = max(best, float(hits.max(axis=1).sum()))
    return best


@pytest.mark.parametrize("G,k,clustered,seed", [(2, 3, True, 0), (4, 3, True, 1),
                                                (4, 3, False, 2), (2, 4, False, 3),
                                                (4, 4, True, 4)])
def test_bound_is_above_every_partition_and_not_above_the_pair_budget_by_much(
        G, k, clustered, seed):
    N = 8
    ex = rows(40, N, k, seed, clustered)
    truth = best_unconstrained(ex, N, N // G)
    out = row_pair_bound(ex, N, G, RowPairConfig(iterations=40))
    assert out["local"] >= truth * (1 - 1e-9)
    # the multipliers start where the pair budget's dual is: the optimiser must not end far
    # above it (it may end below: that is the point)
    assert out["local"] <= layer_bound(ex, N, G)["local"] * 1.02 + 1e-6
    # the eigenvalue form alone (W = 0) is valid too, and so are triangle multipliers
    assert row_pair_bound(ex, N, G, RowPairConfig(iterations=20, nonnegativity=False)
                          )["local"] >= truth * (1 - 1e-9)
    tri = row_pair_bound(ex, N, G, RowPairConfig(iterations=20, triangles=15))
    assert tri["local"] >= truth * (1 - 1e-9)


def test_tighter_than_the_pair_budget_on_clustered_routing():
    """8 experts, G = 4, rows mostly inside one of two halves: the pair budget spends its pairs
    on every row alike (79.4 against an optimum of 73); with a price a row and X >= 0 the
    bound closes (73.0 on 2026-12-07)."""
    ex = rows(40, 8, 3, 0, clustered=True)
    truth = best_unconstrained(ex, 8, 2)
    pair = layer_bound(ex, 8, 4)["local"]
    ours = row_pair_bound(ex, 8, 4, RowPairConfig(iterations=40))["local"]
    assert truth * (1 - 1e-9) <= ours <= truth + 1.0 < pair - 3.0


def test_real_routing_below_the_pair_budget_and_above_placements():
    """DeepSeek-V2-Lite layer 3, 3,000 rows, EP 8: above what real partitions score (random
    ones and the LAR-greedy grouping by co-activation), below the pair budget."""
    from sempar.paths import real_trace_path
    from sempar.placement.set_scan import coactivation
    from sempar.trace import read_trace

    trace = read_trace(real_trace_path("deepseek-v2-lite"))
    ex = np.asarray(trace.experts[:3000, 3], np.int64)
    N, G = trace.meta.num_experts, 8
    S = N // G
    ours = row_pair_bound(ex, N, G, RowPairConfig(iterations=60))["local"]
    pair = layer_bound(ex, N, G)["local"]
    A = coactivation(ex, N)
    left, groups = list(range(N)), []
    while left:                      # greedy: seed with the most active, add the closest
        g = [max(left, key=lambda e: A[e].sum())]
        while len(g) < S:
            g.append(max((e for e in left if e not in g), key=lambda e: A[e, g].sum()))
        groups.append(g)
        left = [e for e in left if e not in g]
    rng = np.random.default_rng(0)
    parts = [np.concatenate(groups)] + [rng.permutation(N) for _ in range(10)]
    for order in parts:
        dev = np.empty(N, np.int64)
        dev[order] = np.arange(N) // S
        local = np.stack([(dev[ex] == d).sum(axis=1) for d in range(G)], 1).max(1).sum()
        assert local <= ours
    assert ours < 0.97 * pair


def test_top_triples_are_the_most_co_activated_with_each_apex():
    from sempar.placement.row_pair_bound import _top_triples

    sets = np.array([[0, 1, 2, 3], [0, 1, 2, 4], [1, 2, 3, 5]], np.int64)
    w = np.array([1.0, 1.0, 0.5])
    tri = _top_triples(sets, w, 6, 1)                # (0, 1, 2): weight 2, the most
    assert sorted(map(tuple, tri)) == [(0, 1, 2), (1, 0, 2), (2, 0, 1)]
    assert _top_triples(sets, w, 6, 0).shape == (0, 3)


def test_lar_upper_bound_uses_it_where_no_lp_runs():
    """lar_upper_bound: where neither the listed nor the scanned LP runs, each layer keeps the
    lower of the row-pair bound and the pair budget, above the optimum; evaluate's fast effort
    leaves it out."""
    from sempar.placement.bound import ROWPAIR_METHOD, lar_upper_bound
    from sempar.placement.device_bound import BOUND_EFFORTS, BoundConfig
    from sempar.trace.schema import RoutingTrace, TraceMeta

    N, G, k = 8, 4, 3
    ex = np.stack([rows(40, N, k, s, clustered=True) for s in (0, 1)], axis=1)   # [T, 2, k]
    T = ex.shape[0]
    trace = RoutingTrace(TraceMeta(model="t", num_layers=2, num_experts=N, top_k=k, vocab_size=4),
                         np.zeros(T, np.int32), np.zeros(T, np.int64),
                         np.arange(T, dtype=np.int32), ex.astype(np.int16)).validate()
    cfg = BoundConfig(max_device_sets=1, colgen_max_sets=0, colgen_large=None,
                      row_pair=RowPairConfig(iterations=40))
    b = lar_upper_bound(trace, G, cfg)
    assert b["per_layer_method"] == [ROWPAIR_METHOD] * 2
    for l in range(2):
        pair = layer_bound(ex[:, l], N, G)["local"] / ex[:, l].size
        assert best_unconstrained(ex[:, l], N, N // G) / ex[:, l].size - 1e-12 \
            <= b["per_layer"][l] < pair
    assert BOUND_EFFORTS["fast"].row_pair is None and BOUND_EFFORTS["full"].row_pair is not None
