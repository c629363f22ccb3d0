"""bench_rows_speed --bound-from: a previous run's bound is reused only where it bounds this run
(same trace, EP and token count, beta at least this run's)."""

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_rows_speed", Path(__file__).parents[2] / "benchmarks" / "bench_rows_speed.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)

ROWS = [{"trace": "gpt", "ep": 8, "tokens": 100, "path": p, "in_sample": lar, "bound": 0.46,
         "bound_method": "LP", "max_imbalance": beta, "best_known": 0.43}
        for p, lar, beta in (("new", 0.41, 1.05), ("exact", 0.42, 1.08))]


def test_reused_bound_keeps_the_bound_and_the_largest_beta():
    b = bench.reused_bound(ROWS, "gpt", 8, 1.07, 100)
    assert b["bound"] == 0.46 and b["bound_method"] == "LP" and b["max_imbalance"] == 1.08
    assert b["in_sample_before"] == {"new": 0.41, "exact": 0.42}


def test_a_bound_for_any_balance_serves_any_beta():
    rows = [dict(r, bound_any_balance=0.46) for r in ROWS]
    assert bench.reused_bound(rows, "gpt", 8, 1.2, 100)["bound"] == 0.46


@pytest.mark.parametrize("args", [("gpt", 4, 1.05, 100), ("gpt", 8, 1.09, 100),
                                  ("gpt", 8, 1.05, 99), ("dsv2", 8, 1.05, 100)])
def test_reused_bound_refuses_what_it_does_not_bound(args):
    with pytest.raises(SystemExit):
        bench.reused_bound(ROWS, *args)
