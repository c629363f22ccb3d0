"""`evaluate --home-rule`: tp's oracle homes by either capacity home rule
(`capacity.ASSIGN_RULES`); the default is the optimal assignment (issue 46), the greedy proposal
rounds stay selectable by name and never score above it, the entry says which rule scored it
when it is not the default, and a bad name exits 2 in one line. A guard fails if any default
path (evaluate's oracle homes, the exact pre-router, the CLI's default) uses the greedy rule."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import build_trace, run_cli, write_unchecked
from sempar.placement import capacity, solve
from sempar.placement.metrics import placement_figures
from sempar.schedule.homes import oracle_home
from sempar.trace import read_trace, split_by_request


def test_home_rule_scores_the_tp_oracle(tmp_path):
    write_unchecked(build_trace(T=600, R=20, L=2, N=8, k=2), tmp_path / "t.parquet")
    fit, ev = split_by_request(read_trace(tmp_path / "t.parquet"), seed=0)
    p = solve("vanilla", fit, num_devices=4, mode="tp")
    figs = {}
    for rule in ("optimal", "proposal"):
        extra = [] if rule == "optimal" else ["--home-rule", rule]      # the default
        r = run_cli("evaluate", "--fit", "t.parquet", "--split", "--ep", "4", "--mode", "tp",
                    "--methods", "vanilla", "--bound", "none", "--json", *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d.get("home_rule") == (None if rule == "optimal" else "proposal")
        figs[rule] = d["methods"]["vanilla"]
    assert figs["optimal"]["oracle_lar_mean"] >= figs["proposal"]["oracle_lar_mean"]
    assert figs["optimal"]["lar_mean"] == figs["proposal"]["lar_mean"]    # the method's homes
    # each figure is its rule's on the eval split, as the library computes it
    for rule in ("optimal", "proposal"):
        want = placement_figures(p, ev.experts, oracle_home(p, ev.experts, rule=rule))
        assert np.isclose(figs[rule]["oracle_lar_mean"], want["lar_mean"])


def test_bad_home_rule_exits_2_in_one_line(tmp_path):
    r = run_cli("evaluate", "--fit", "missing.parquet", "--split", "--ep", "4", "--home-rule",
                "best", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "--home-rule: 'best' is not one of proposal, optimal" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_default_paths_never_use_the_greedy_rule(monkeypatch):
    """With the greedy rule made to fail, every default path still runs and scores the optimum
    (the solvers' search loops keep the greedy rule by name: `capacity.SEARCH_ASSIGN`)."""
    from sempar.commands.evaluate import HOME_RULE
    from sempar.schedule.evaluate import OracleHomes, figures_for
    from sempar.schedule.prerouter import exact_homes

    assert capacity.DEFAULT_ASSIGN == HOME_RULE == OracleHomes().rule == "optimal"
    assert capacity.SEARCH_ASSIGN == "proposal" and capacity.ASSIGN_RULES.names() == [
        "proposal", "optimal"]
    trace = build_trace(T=600, R=20, L=2, N=8, k=2)
    fit, ev = split_by_request(trace, seed=0)
    p = solve("vanilla", fit, num_devices=4, mode="tp")
    greedy = placement_figures(p, ev.experts, oracle_home(p, ev.experts, rule="proposal"))
    best = placement_figures(p, ev.experts, oracle_home(p, ev.experts, rule="optimal"))
    assert best["lar_mean"] > greedy["lar_mean"]            # the case tells the rules apart

    def refuse(hits, caps):
        raise AssertionError("a default path used the greedy proposal rule")

    monkeypatch.setitem(capacity.ASSIGN_RULES._items, "proposal", refuse)
    with pytest.raises(AssertionError, match="greedy"):          # the guard bites
        oracle_home(p, ev.experts, rule="proposal")
    assert placement_figures(p, ev.experts, oracle_home(p, ev.experts))["lar_mean"] \
        == best["lar_mean"]
    f = figures_for(p, ev, "tp")
    assert np.isclose(f["oracle_lar_mean"], best["lar_mean"])
    pre = exact_homes(torch.from_numpy(np.asarray(ev.experts, np.int64)),
                      torch.from_numpy(p.hosts()), batch=capacity.BATCH)
    assert (pre.numpy() == oracle_home(p, ev.experts)).all()
