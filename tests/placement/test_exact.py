"""`sempar-exact` (placement/exact.py): never below `sempar`'s fit figure on any layer, within
each layer's cap, reporting the MILP's gap; `sempar` itself where the exact start does not
apply."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import build_trace
from sempar.errors import InputError
from sempar.placement import SOLVERS, solve
from sempar.placement.base import PlacementProblem
from sempar.placement.config_ilp import expert_devices, imbalance, layer_local
from sempar.placement.sempar.config import SemparConfig
from sempar.placement.sempar.held_out import derived_held_out
from sempar.placement.sempar.rows import row_trace
from sempar.solve_options import SolveOptions


def test_registered_beside_sempar():
    names = SOLVERS.names()
    assert "sempar-exact" in names and names.index("sempar-exact") > names.index("sempar")


def test_never_below_sempar_on_the_fit_figure_within_the_cap():
    trace = build_trace(T=400, L=3, N=8, k=2, seed=3)
    G = 2
    ours = solve("sempar-exact", trace, num_devices=G, objective="rows")
    base = solve("sempar", trace, num_devices=G, objective="rows")
    layers = ours.info["exact"]["layers"]
    assert len(layers) == 3 and ours.method == "sempar-exact"
    for l, row in enumerate(layers):
        ex = np.asarray(trace.experts[:, l], np.int64)
        count = np.bincount(ex.ravel(), minlength=8).astype(np.float64)
        mine, theirs = (expert_devices(p.phy2log[l], G) for p in (ours, base))
        assert layer_local(mine, ex, G) >= layer_local(theirs, ex, G) - 1e-9
        assert imbalance(mine, count, G) <= row["cap"] * (1 + 1e-3)     # cap rounded to 4 places
        if row["kept"] != "sempar":          # sempar's own load model's cap, margin included
            assert row["robust_load"] <= row["fit_cap"] * (1 + 1e-3)
        assert row["lar_" + row["kept"]] == pytest.approx(layer_local(mine, ex, G) / ex.size,
                                                          abs=1e-5)
        assert row["milp_optimal"] and row["milp_gap"] <= 1e-4
        assert row["milp_bound"] >= row["lar_" + row["kept"]] - 1e-5    # the MILP's bound holds


def test_its_held_out_prediction_is_its_own_not_sempars():
    # the exact partition is not the one sempar's cap search predicted: it is re-predicted
    # with sempar's folds' inflation, and it promises the budget only where both can
    trace = build_trace(T=400, L=3, N=8, k=2, seed=3)
    p = PlacementProblem.of(trace, 2, SolveOptions(objective="rows"))
    base = solve("sempar", trace, num_devices=2, objective="rows")
    ours = solve("sempar-exact", trace, num_devices=2, objective="rows")
    h, b = ours.info["held_out"], base.info["held_out"]
    assert h["derived"] and "derived" not in b
    assert h["base_predicted_imbalance"] == b["predicted_imbalance"]
    assert h["fit_cap"] == b["fit_cap"]
    assert not h["within_budget"] and "not promised" in h["warning"]   # not cross-validated
    cfg = SemparConfig.for_problem(p)
    rows = row_trace(trace, cfg.budget_rows, p.seed)
    same = derived_held_out(base, rows, b, cfg.held_out(p))    # sempar's own partition
    assert same["predicted_imbalance"] == pytest.approx(b["predicted_imbalance"], abs=1e-4)
    mine = derived_held_out(ours, rows, b, cfg.held_out(p))
    assert mine["predicted_imbalance"] == h["predicted_imbalance"]


def test_falls_back_to_sempar_where_the_exact_start_does_not_apply():
    trace = build_trace(T=200, L=2, N=8, k=2, seed=1)
    tokens = solve("sempar-exact", trace, num_devices=2, objective="tokens")
    assert tokens.info["exact"] == {"fallback": "tokens objective"}
    assert np.array_equal(tokens.phy2log,
                          solve("sempar", trace, num_devices=2, objective="tokens").phy2log)
    with pytest.raises(InputError, match="serves only tp"):      # its program is tp's figure
        solve("sempar-exact", trace, num_devices=2, mode="dp")
    wide = build_trace(T=200, L=1, N=32, k=2, seed=2)
    out = solve("sempar-exact", wide, num_devices=2, objective="rows")
    assert out.info["exact"]["fallback"].startswith("C(32, 16) device sets exceed")


def test_evaluate_hands_sempar_its_own_placement_and_the_result_is_the_same(monkeypatch):
    """`extends="sempar"`: evaluate solves `sempar` once and sempar-exact starts from it; the
    placement equals sempar-exact solved alone."""
    from sempar.placement import exact
    from sempar.schedule.evaluate import evaluate_modes
    from sempar.solve_options import SolveOptions

    assert SOLVERS.get("sempar-exact").extends == "sempar"
    trace = build_trace(T=400, L=2, N=8, k=2, seed=5)
    alone = solve("sempar-exact", trace, num_devices=2, objective="rows")
    calls = []
    real = exact.sempar
    monkeypatch.setattr(exact, "sempar", lambda p: calls.append(1) or real(p))
    placements: dict = {}
    evaluate_modes(trace, trace, 2, modes=("tp",), methods=["sempar", "sempar-exact"],
                   options=SolveOptions(objective="rows"), placements=placements)
    assert calls == []                         # no second sempar solve inside sempar-exact
    assert np.array_equal(placements[("sempar-exact", "tp")].phy2log, alone.phy2log)
