"""bench_placement's balance floor: the exhaustive equal-slot search it restates budgets with."""

import importlib.util
import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_placement", Path(__file__).parents[1] / "benchmarks" / "bench_placement.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def _trace(loads: list[list[int]]) -> SimpleNamespace:
    """A top-1 trace whose layer l selects expert e loads[l][e] times."""
    L, N = len(loads), len(loads[0])
    cols = [np.repeat(np.arange(N), row) for row in loads]
    T = cols[0].size
    assert all(c.size == T for c in cols)
    experts = np.stack([np.random.default_rng(l).permutation(c) for l, c in enumerate(cols)],
                       axis=1)[:, :, None].astype(np.uint8)
    return SimpleNamespace(meta=SimpleNamespace(num_experts=N, num_layers=L), experts=experts)


@pytest.mark.parametrize("n,size,count", [(8, 2, 105), (9, 3, 280), (6, 3, 10), (4, 4, 1)])
def test_groupings_are_every_split_once(n, size, count):
    splits = list(bench._groupings(tuple(range(n)), size))
    assert len(splits) == count
    assert len({frozenset(map(frozenset, s)) for s in splits}) == count
    assert all(sorted(e for g in s for e in g) == list(range(n)) for s in splits)


def test_balance_floor_is_the_best_split_per_layer():
    rng = np.random.default_rng(0)
    loads = [[3, 1, 1, 1], [1, 2, 2, 1]]
    assert bench.balance_floor(_trace(loads), 2) == pytest.approx((4 / 3 + 1.0) / 2)     # {0, 1} {2, 3}; {0, 3} {1, 2}
    loads = [rng.multinomial(240, rng.dirichlet(np.ones(8))).tolist() for _ in range(3)]
    ev = _trace(loads)
    brute = []
    for row in loads:                      # every assignment of 2 experts to each of 4 devices
        best = min(max(sum(row[e] for e in p[2 * d:2 * d + 2]) for d in range(4))
                   for p in itertools.permutations(range(8)))
        brute.append(best / (sum(row) / 4))
    assert bench.balance_floor(ev, 4) == pytest.approx(np.mean(brute))


def test_balance_floor_gives_up_on_many_experts():
    assert bench.balance_floor(_trace([[1] * 64]), 4) is None
    assert bench.balance_floor(_trace([[1] * 9]), 4) is None      # 9 experts do not split over 4


def test_sempar_config_is_recorded():
    """The JSON report records the settings sempar solves with, decided for the fit trace."""
    import json

    fit = SimpleNamespace(num_tokens=1000, meta=SimpleNamespace(num_layers=2, num_experts=8))
    config = bench.sempar_config(fit, 4)
    assert json.loads(json.dumps(config)) == config
    assert config["large_trace"] is False and config["sparse_step"] is False
    assert config["bounded_experts"] is False
