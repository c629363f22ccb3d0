"""`sempar evaluate --fit-stats`: the sempar placement solved from statistics, judged on a
trace, gives the figures `evaluate --fit` gives for the trace the statistics summarise (same
seed, rows objective); the refusals are one line."""

from __future__ import annotations

import json

import numpy as np

from conftest import build_trace, run_cli
from sempar.trace.io import write_trace


def _shards(tmp_path, trace, n=3):
    reqs = np.unique(trace.request_id)
    order, paths = [], []
    for i, part in enumerate(np.array_split(reqs, n)):
        rows = np.flatnonzero(np.isin(trace.request_id, part))
        order.append(rows)
        paths.append(tmp_path / f"s{i}.parquet")
        write_trace(trace.take(rows), paths[-1])
    whole = tmp_path / "whole.parquet"
    write_trace(trace.take(np.concatenate(order)), whole)
    return paths, whole


def test_fit_stats_equals_fit_on_the_trace(tmp_path):
    fit = build_trace(T=600, R=60, L=3, N=8, k=2, seed=3)
    ev = build_trace(T=300, R=30, L=3, N=8, k=2, seed=4)
    shards, whole = _shards(tmp_path, fit)
    evp = tmp_path / "eval.parquet"
    write_trace(ev, evp)
    args = [a for p in shards for a in ("--trace", p)]
    r = run_cli("stats", "build", *args, "--out", tmp_path / "s.stats")
    assert r.returncode == 0, r.stderr
    common = ("--eval", evp, "--ep", "4", "--objective", "rows", "--json")
    a = run_cli("evaluate", "--fit-stats", tmp_path / "s.stats", *common)
    b = run_cli("evaluate", "--fit", whole, "--methods", "sempar", *common)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    x, y = json.loads(a.stdout), json.loads(b.stdout)
    fx, fy = x["methods"]["sempar"], y["methods"]["sempar"]
    fx.pop("solve_seconds"), fy.pop("solve_seconds")
    assert fx == fy
    assert fx["lar_mean"] > 0
    assert x["refs"] == {k: v for k, v in y["refs"].items() if k in x["refs"]}
    assert x["fit"]["tokens"] == y["fit"]["tokens"] == 600
    assert x["eval"] == y["eval"]


def test_fit_stats_refusals(tmp_path):
    fit = build_trace(T=120, R=12, seed=1)
    p = tmp_path / "f.parquet"
    write_trace(fit, p)
    assert run_cli("stats", "build", "--trace", p, "--out", tmp_path / "s.stats").returncode == 0
    s = tmp_path / "s.stats"
    for extra, words in ((("--fit", p, "--eval", p), "one of --fit or --fit-stats"),
                         (("--split",), "--split"),
                         (("--eval", p, "--methods", "eplb"), "only the sempar solver"),
                         ((), "give --eval")):
        r = run_cli("evaluate", "--fit-stats", s, "--ep", "4", "--objective", "rows", *extra)
        assert r.returncode == 2 and words in r.stderr, (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
