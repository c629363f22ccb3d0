"""`sempar`'s rows objective (placement/sempar/rows.py) and its replicas (row_replicas.py): on
a planted instance where a row's experts cluster but its token id says nothing, the rows
objective recovers the clusters under exact pre-routing and the tokens objective cannot."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.errors import InputError
from sempar.placement import Placement, solve
from sempar.placement.metrics import placement_figures
from sempar.placement.sempar.rows import row_trace, sample_requests
from sempar.placement.sempar.row_replicas import expert_served, served_load
from sempar.placement.serving import node_order
from sempar.schedule.homes import oracle_home
from sempar.trace import split_by_request
from sempar.trace.schema import RoutingTrace, TraceMeta

G, N, K, L = 4, 16, 2, 2


def row_planted(T: int = 16_000, R: int = 200, p_in: float = 0.9, seed: int = 0):
    """(trace, expert cluster int[L, N]): each row draws a cluster uniformly (not from its token
    id, one of 4 at random) and picks its K experts inside it with probability p_in."""
    rng = np.random.default_rng(seed)
    ecl = np.stack([rng.permutation(np.arange(N) // (N // G)) for _ in range(L)])
    request_id = np.sort(rng.integers(0, R, T)).astype(np.int32)
    row_cluster = rng.integers(0, G, T)
    experts = np.empty((T, L, K), np.int16)
    for l in range(L):
        members = np.stack([np.flatnonzero(ecl[l] == g) for g in range(G)])
        own = members[row_cluster][np.arange(T)[:, None],
                                   np.argsort(rng.random((T, N // G)), axis=1)[:, :K]]
        anyw = np.argsort(rng.random((T, N)), axis=1)[:, :K]
        experts[:, l] = np.where((rng.random(T) < p_in)[:, None], own, anyw)
    position = (np.arange(T) - np.searchsorted(request_id, request_id)).astype(np.int32)
    meta = TraceMeta(model="planted-rows", num_layers=L, num_experts=N, top_k=K, vocab_size=4)
    trace = RoutingTrace(meta=meta, token_id=rng.integers(0, 4, T).astype(np.int32),
                         request_id=request_id, position=position, experts=experts)
    return trace, ecl


def exact(p: Placement, trace: RoutingTrace) -> dict:
    return placement_figures(p, trace.experts, oracle_home(p, trace.experts))


@pytest.fixture(scope="module")
def case():
    trace, ecl = row_planted()
    fit, ev = split_by_request(trace, seed=0)
    planted = Placement(np.stack([np.argsort(ecl[l], kind="stable") for l in range(L)]), N, G)
    return fit, ev, planted


def test_rows_objective_recovers_row_clusters(case):
    fit, ev, planted = case
    best = exact(planted, ev)["lar_mean"]
    # a loose cap: the robust load model charges the planted groups' request-level spread
    rows = solve("sempar", fit, num_devices=G, objective="rows", max_imbalance=1.2)
    tokens = solve("sempar", fit, num_devices=G, objective="tokens", max_imbalance=1.2)
    f_rows, f_tok = exact(rows, ev), exact(tokens, ev)
    assert rows.info["objective"] == "rows" and tokens.info["objective"] == "tokens"
    assert f_rows["lar_mean"] >= 0.97 * best
    assert f_rows["lar_mean"] >= f_tok["lar_mean"] + 0.1       # token ids carry nothing here
    assert f_rows["imbalance_max_mean"] <= 1.2
    again = solve("sempar", fit, num_devices=G, objective="rows", max_imbalance=1.2)
    assert np.array_equal(again.phy2log, rows.phy2log)
    # the token table is rebuilt for the real ids, not left per fit row
    assert rows.token_table is not None and rows.token_table.token_id.size <= 4


def test_rows_replicas_add_local_activations_under_the_cap(case):
    fit, ev, _ = case
    base = solve("sempar", fit, num_devices=G, objective="rows")
    rep = solve("sempar", fit, num_devices=G, objective="rows", redundant=G)
    assert rep.slots_per_device == N // G + 1
    f0, f1 = exact(base, fit), exact(rep, fit)
    assert f1["lar_mean"] >= f0["lar_mean"]
    assert f1["imbalance_max_mean"] <= max(1.05, f0["imbalance_max_mean"]) + 1e-9


def test_served_load_follows_the_serving_rule():
    node_of = np.array([0, 0, 1, 1])
    host = np.array([False, True, False, True])
    w = np.array([1.0, 2.0, 4.0, 8.0])
    # device 0 (node 0) -> replica 1 on its node; device 2 (node 1) -> replica 3 on its node
    assert expert_served(w, host, node_order(node_of)).tolist() == [0.0, 3.0, 0.0, 12.0]
    one_node = np.zeros(4, np.int64)
    assert expert_served(w, host, node_order(one_node)).tolist() == [0.0, 7.0, 0.0, 8.0]
    W = np.stack([w, w], axis=1)
    hosts = np.stack([host, np.array([True, False, False, False])], axis=1)
    assert served_load(W, hosts, one_node).tolist() == [15.0, 7.0, 0.0, 8.0]


def test_row_sample_keeps_whole_requests():
    request_id = np.repeat(np.arange(10), 7)
    rows = sample_requests(request_id, 30, seed=1)
    assert rows.size <= 30 and np.all(np.diff(rows) > 0)
    kept = np.unique(request_id[rows])
    assert np.array_equal(np.flatnonzero(np.isin(request_id, kept)), rows)
    assert sample_requests(request_id, 100, seed=1).size == 70


def test_row_trace_gives_each_row_its_own_token(case):
    fit, _, _ = case
    rt = row_trace(fit, 10**9, 0)
    assert np.array_equal(rt.token_id, np.arange(fit.num_tokens))
    assert rt.meta.vocab_size == fit.num_tokens
    rt.validate()


def test_unknown_objective_is_refused(case):
    fit, _, _ = case
    with pytest.raises(InputError, match="--objective"):
        solve("sempar", fit, num_devices=G, objective="words")


def test_without_token_ids_auto_solves_rows_and_tokens_is_refused(case):
    from sempar.trace.ops import without_token_ids

    fit, ev, _ = case
    bare = without_token_ids(fit)
    p = solve("sempar", bare, num_devices=G, max_imbalance=1.2)
    assert p.info["objective"] == "rows" and p.token_table is None
    assert exact(p, ev)["lar_mean"] >= exact(solve("vanilla", bare, num_devices=G), ev)["lar_mean"] + 0.2
    with pytest.raises(InputError, match="token ids"):
        solve("sempar", bare, num_devices=G, objective="tokens")


def test_held_out_prediction_and_calibration(case):
    from sempar.placement.sempar.held_out import HeldOut, imbalance, predicted_imbalance, request_loads

    fit, ev, _ = case
    loose = solve("sempar", fit, num_devices=G, objective="rows", max_imbalance=1.2,
                  held_out_imbalance=99.0)
    X = request_loads(loose, fit)
    assert X.sum() == fit.num_tokens * L * K                   # every activation, once
    assert X.shape == (np.unique(fit.request_id).size, L, G)
    fit_imb = imbalance(X.sum(axis=0))
    pred = predicted_imbalance(loose, fit, HeldOut(replicates=20))
    assert pred >= fit_imb                                      # resampling only adds spread
    # the population's loads (one resample): near the 4x larger held-out set's; a new sample
    # as large as the fit one (two resamples) predicts more spread
    held = exact(loose, ev)["imbalance_max_mean"]
    assert held - 0.04 <= pred <= held + 0.06
    assert predicted_imbalance(loose, fit, HeldOut(replicates=20, resamples=2)) > pred
    # a tight held-out target lowers the fit cap and the predicted imbalance with it
    tight = solve("sempar", fit, num_devices=G, objective="rows", max_imbalance=1.2,
                  held_out_imbalance=1.0)
    h = tight.info["held_out"]
    assert h["target"] == 1.0 and h["fit_cap"] < 1.2
    assert h["predicted_imbalance"] <= pred + 1e-9


def test_cross_validated_prediction_says_when_the_fit_cannot_promise(case):
    """held_out.py step 3 and 5 (issue 45): the prediction carries the folds' inflation; an
    unreachable target and a fit too small to cross-validate are not within budget, with a
    warning."""
    from sempar.placement.sempar.held_out import inflation_of

    fit, ev, _ = case
    loose = solve("sempar", fit, num_devices=G, objective="rows", max_imbalance=1.2,
                  held_out_imbalance=99.0)
    h = loose.info["held_out"]
    assert len(h["cv_folds"]) == 4 and h["cv_inflation"] >= 1.0
    assert h["predicted_imbalance"] >= h["bootstrap_imbalance"] - 1e-9
    assert h["within_budget"] and "warning" not in h
    held = exact(loose, ev)["imbalance_max_mean"]
    assert held - 0.04 <= h["predicted_imbalance"] <= held + 0.06
    tight = solve("sempar", fit, num_devices=G, objective="rows", max_imbalance=1.2,
                  held_out_imbalance=1.0)
    assert not tight.info["held_out"]["within_budget"]
    assert "too small to promise" in tight.info["held_out"]["warning"]
    few = fit.take(np.isin(fit.request_id, np.unique(fit.request_id)[:5]))
    small = solve("sempar", few, num_devices=G, objective="rows", max_imbalance=1.2)
    assert not small.info["held_out"]["within_budget"]
    assert "too few" in small.info["held_out"]["warning"]
    # the pooled ratio: residuals beyond the folds' noise over the bootstrap's expectation
    assert inflation_of([{"residual": 7.0, "noise": 3.0, "naive": 1.0},
                         {"residual": 2.0, "noise": 2.0, "naive": 1.0}]) == 2.0
    assert inflation_of([{"residual": 1.0, "noise": 3.0, "naive": 1.0}]) == 1.0


def test_evaluate_prints_the_budget_warning():
    from sempar.schedule.evaluate import held_out_warnings

    res = {"methods": {"sempar": {"held_out": {"within_budget": False, "warning": "too small"}},
                       "eplb": {},
                       "ok": {"held_out": {"within_budget": True}}}}
    assert held_out_warnings(res) == ["warning: sempar: too small"]


def test_cap_search_keeps_the_highest_cap_within_and_refolds(monkeypatch):
    """held_out.calibrated_solve's cap search (issue 45): the excess step, then the secant
    step; the highest cap whose upper prediction is within the target is kept, the folds solved
    again there. A stand-in solver whose upper prediction is 1.05 + 2 x (cap - 1)."""
    import types

    from sempar.placement.sempar import held_out as ho

    caps, folds_at = [], []

    def solve(q):
        caps.append(q.max_imbalance)
        return types.SimpleNamespace(info={}, cap=q.max_imbalance)

    def cv(q, fold, h):
        folds_at.append(q.max_imbalance)
        return {"inflation": 1.0, "upper": 2.0, "folds": []}

    monkeypatch.setattr(ho, "cv_inflation", cv)
    monkeypatch.setattr(ho, "request_loads", lambda placed, trace: placed.cap)
    monkeypatch.setattr(ho, "_bootstrap", lambda X, h, inflation=1.0:
                        1.0 + (inflation - 1.0) * (0.05 + 2 * (X - 1.0)))
    trace = types.SimpleNamespace(request_id=np.arange(40),         # 8 experts evenly used
                                  experts=(np.arange(80) % 8).reshape(40, 1, 2),
                                  meta=types.SimpleNamespace(num_layers=1, num_experts=8))
    p = types.SimpleNamespace(max_imbalance=1.05, trace=trace, num_devices=4, redundant=0)
    monkeypatch.setattr(ho.dataclasses, "replace", lambda q, **kw: types.SimpleNamespace(
        **{**vars(q), **kw}))
    out = ho.calibrated_solve(p, solve, ho.HeldOut(target=1.10, margin=0.0))
    h = out.info["held_out"]
    # 1.05 (1.15) -> excess 1.0 (1.05) -> secant 1.025 (1.10, on the line: within) -> the
    # bracket (1.025, 1.05) meets the aim at its low end: the guard probes 1.0275 (1.105)
    assert [c for c, _ in h["caps_tried"]] == pytest.approx([1.05, 1.0, 1.025, 1.0275])
    assert h["fit_cap"] == pytest.approx(1.025) and h["within_budget"]
    assert folds_at == pytest.approx([1.05, 1.025])       # refolded at the kept cap
    assert h["refolded"]["cap"] == pytest.approx(1.025)


def test_point_fallback_searches_below_one_on_the_point_prediction(monkeypatch):
    """held_out.calibrated_solve, fallback "point" (issue 45, step 6): no cap from 1.0 up has
    its upper prediction within the target, so the cap is searched on the point prediction,
    below 1.0 as the `fit_cap` keyword (the problem's cap stays 1.0), and the promise stays
    false. A stand-in whose point prediction is 1.08 + 2 x (cap - 0.99) at inflation 2 and
    whose upper is 0.1 higher."""
    import types

    from sempar.placement.sempar import held_out as ho

    caps = []

    def solve(q, fit_cap=None):
        cap = q.max_imbalance if fit_cap is None else fit_cap
        assert q.max_imbalance >= 1.0
        caps.append(cap)
        return types.SimpleNamespace(info={}, cap=cap)

    monkeypatch.setattr(ho, "cv_inflation", lambda q, fold, h: {
        "inflation": 2.0, "upper": 3.0, "folds": []})
    monkeypatch.setattr(ho, "request_loads", lambda placed, trace: placed.cap)
    monkeypatch.setattr(ho, "_bootstrap", lambda X, h, inflation=1.0: {
        1.0: 1.0, 2.0: 1.08 + 2 * (X - 0.99), 3.0: 1.18 + 2 * (X - 0.99)}[inflation])
    trace = types.SimpleNamespace(request_id=np.arange(40),         # 8 experts evenly used
                                  experts=(np.arange(80) % 8).reshape(40, 1, 2),
                                  meta=types.SimpleNamespace(num_layers=1, num_experts=8))
    p = types.SimpleNamespace(max_imbalance=1.05, trace=trace, num_devices=4, redundant=0)
    monkeypatch.setattr(ho.dataclasses, "replace", lambda q, **kw: types.SimpleNamespace(
        **{**vars(q), **kw}))
    held = ho.HeldOut(target=1.10, margin=0.0, retries=3, fallback="point", min_cap=0.95,
                      point_retries=2)
    h = ho.calibrated_solve(p, solve, held).info["held_out"]
    # upper: 1.05 (1.30), 1.0 (1.20, floor), then the point: 1.0 (1.10 within), 1.05 (1.22)
    # -> secant steps (the line meets 1.10 at 1.0: the guard's tenth of the bracket) 1.005
    # (1.11), 1.0005 (1.101): the highest within stays 1.0
    assert [c for c, _ in h["caps_tried"]][:2] == pytest.approx([1.05, 1.0])
    assert [c for c, _ in h["point_caps"]][-2:] == pytest.approx([1.005, 1.0005])
    assert h["fit_cap"] == pytest.approx(1.0) and not h["within_budget"]
    held = ho.dataclasses.replace(held, target=1.09)
    caps.clear()
    h = ho.calibrated_solve(p, solve, held).info["held_out"]
    # the point at 1.0 (1.10) is above 1.09: the excess step goes below 1.0, to 0.99 (1.08),
    # then the secant step to 0.995 (1.09, within)
    assert min(caps) == pytest.approx(0.99) and h["fit_cap"] == pytest.approx(0.995)
    assert h["predicted_imbalance"] == pytest.approx(1.09) and not h["within_budget"]
    assert "fit on more requests" in h["warning"] and h["point_caps"]
    # point_margin (h45d): the point search alone aims at 1.10 - 0.01, the upper one at 1.10
    held = ho.dataclasses.replace(held, target=1.10, point_margin=0.01)
    caps.clear()
    h = ho.calibrated_solve(p, solve, held).info["held_out"]
    assert [c for c, _ in h["caps_tried"]][:2] == pytest.approx([1.05, 1.0])
    assert min(caps) == pytest.approx(0.99) and h["fit_cap"] == pytest.approx(0.995)


def test_upper_fallback_keeps_the_lowest_upper():
    """fallback "upper" (the rule before issue 45's step 6) never solves below 1.0."""
    from sempar.placement.sempar.cap_search import kept_cap as _kept, search_cap as _search

    tried = [(1.05, None, 1.0, 1.2, 1.3)]
    _search(tried, lambda c: (c, None, 1.0, 1.1 + c - 1.0, 1.2 + c - 1.0), 4, 1.1, 3, 1.0)
    assert [t[0] for t in tried] == pytest.approx([1.05, 1.0])
    assert _kept(tried, 4, 1.1)[0] == pytest.approx(1.0)


def test_secant_step_lands_where_the_line_meets_the_aim():
    """cap_search.search_cap (h45s): with a bracket, the next cap is where the straight line through
    the two predictions meets the aim, kept a tenth of the bracket inside its ends; a linear
    prediction is then hit in one solve where bisection would take several."""
    from sempar.placement.sempar.cap_search import SECANT_GUARD, kept_cap as _kept, search_cap as _search

    line = lambda c: (c, None, 1.0, 1.0835 + 1.5 * (c - 0.987), 9.0)     # noqa: E731
    tried = [line(1.0), line(0.987)]                  # 1.1030 above, 1.0835 within 1.09
    _search(tried, line, 3, 1.09, 1, 0.95)
    assert tried[-1][0] == pytest.approx(0.987 + 0.0065 / 1.5)
    assert _kept(tried, 3, 1.09)[0] == pytest.approx(tried[-1][0])
    # an end on the aim: the guard keeps the probe inside the bracket
    tried = [line(1.0), (0.99, None, 1.0, 1.09, 9.0)]
    _search(tried, line, 3, 1.09, 1, 0.95)
    assert tried[-1][0] == pytest.approx(0.99 + SECANT_GUARD * 0.01)
