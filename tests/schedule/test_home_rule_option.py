"""`evaluate --home-rule`: tp's oracle homes by either capacity home rule
(`capacity.ASSIGN_RULES`); the default stays the greedy proposal rounds, the optimal rule never
scores below it, the entry says which rule scored it, and a bad name exits 2 in one line."""

from __future__ import annotations

import json

import numpy as np

from conftest import build_trace, run_cli, write_unchecked
from sempar.placement import solve
from sempar.placement.metrics import placement_figures
from sempar.schedule.homes import oracle_home
from sempar.trace import read_trace, split_by_request


def test_home_rule_scores_the_tp_oracle(tmp_path):
    write_unchecked(build_trace(T=600, R=20, L=2, N=8, k=2), tmp_path / "t.parquet")
    fit, ev = split_by_request(read_trace(tmp_path / "t.parquet"), seed=0)
    p = solve("vanilla", fit, num_devices=4, mode="tp")
    figs = {}
    for rule in ("proposal", "optimal"):
        extra = [] if rule == "proposal" else ["--home-rule", rule]     # the default
        r = run_cli("evaluate", "--fit", "t.parquet", "--split", "--ep", "4", "--mode", "tp",
                    "--methods", "vanilla", "--bound", "none", "--json", *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d.get("home_rule") == (None if rule != "optimal" else "optimal")
        figs[rule] = d["methods"]["vanilla"]
    want = placement_figures(p, ev.experts, oracle_home(p, ev.experts, rule="proposal"))
    assert np.isclose(figs["proposal"]["oracle_lar_mean"], want["lar_mean"])
    assert figs["optimal"]["oracle_lar_mean"] >= figs["proposal"]["oracle_lar_mean"]
    assert figs["optimal"]["lar_mean"] == figs["proposal"]["lar_mean"]    # the method's homes
    # each figure is its rule's on the eval split, as the library computes it
    want = placement_figures(p, ev.experts, oracle_home(p, ev.experts, rule="optimal"))
    assert np.isclose(figs["optimal"]["oracle_lar_mean"], want["lar_mean"])


def test_bad_home_rule_exits_2_in_one_line(tmp_path):
    r = run_cli("evaluate", "--fit", "missing.parquet", "--split", "--ep", "4", "--home-rule",
                "best", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "--home-rule: 'best' is not one of proposal, optimal" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""
