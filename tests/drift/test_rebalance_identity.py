"""`rebalance` refuses a window of another model than the placement's (issue 47, kind 6):
expert ids below the placement's count are not enough (an 8-expert window fits a 64-expert
placement's ids), nor is the shape (another model's name)."""

from __future__ import annotations

import dataclasses

from conftest import build_trace
from hostile import refused, run
from sempar.trace.io import write_trace


def test_a_window_of_another_model_is_refused(tmp_path):
    fit = build_trace(T=400, R=40, L=3, N=64, k=2)
    write_trace(fit, tmp_path / "fit.parquet")
    code, _, err = run(["place", "--trace", tmp_path / "fit.parquet", "--method", "vanilla",
                        "--ep", "4", "--out", tmp_path / "p.json"], tmp_path)
    assert code == 0, err
    small = build_trace(T=200, R=20, L=3, N=8, k=2)
    renamed = build_trace(T=200, R=20, L=3, N=64, k=2, seed=3)
    renamed.meta = dataclasses.replace(renamed.meta, model="another-moe")
    for name, window, words in (("small", small, "another model"),
                                ("renamed", renamed, "another model")):
        write_trace(window, tmp_path / f"{name}.parquet")
        out = tmp_path / f"{name}.json"
        refused(["rebalance", "--placement", tmp_path / "p.json", "--trace",
                 tmp_path / f"{name}.parquet", "--ep", "4", "--out", out], tmp_path, words, out)
    same = build_trace(T=200, R=20, L=3, N=64, k=2, seed=4)
    write_trace(same, tmp_path / "same.parquet")
    code, _, err = run(["rebalance", "--placement", tmp_path / "p.json", "--trace",
                        tmp_path / "same.parquet", "--ep", "4", "--expert-bytes", "1e6",
                        "--remote-bytes", "1e3", "--out", tmp_path / "n.json"],
                       tmp_path)
    assert code == 0, err
