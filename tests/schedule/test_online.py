"""Online data scheduling judged on held-out routing (`evaluate --online`, issue 5)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from sempar.placement import solve
from sempar.placement.metrics import placement_figures
from sempar.placement.capacity import BATCH
from sempar.schedule.homes import home_tp_contiguous
from sempar.schedule.online import OnlineScheduler, online_figures
from sempar.trace import split_by_request, write_trace
from sempar.trace.synth import synthesize


@pytest.fixture(scope="module")
def data():
    t = synthesize("olmoe-1b-7b", 16000, requests=80, seed=7)
    fit, ev = split_by_request(t, seed=0)
    return t, fit, ev, solve("semmoe", fit, num_devices=4)


def test_tp_homes_are_equal_chunks_and_beat_position_split(data) -> None:
    _, fit, ev, p = data
    home = OnlineScheduler().fit(fit, p).home_tp(ev)
    assert home.shape == (ev.num_tokens, ev.meta.num_layers)
    for lo in range(0, ev.num_tokens, BATCH):
        for l in (0, ev.meta.num_layers - 1):
            c = np.bincount(home[lo:lo + BATCH, l], minlength=4)
            assert c.max() - c.min() <= 1
    online = placement_figures(p, ev.experts, home)["lar_mean"]
    position = placement_figures(p, ev.experts,
                                 home_tp_contiguous(ev.num_tokens, 4, ev.meta.num_layers))["lar_mean"]
    assert online > 1.2 * position


def test_dp_homes_keep_requests_whole(data) -> None:
    _, fit, ev, p = data
    home = OnlineScheduler().fit(fit, p).home_dp(ev, "alg2")
    for r in np.unique(ev.request_id)[:20]:
        assert np.unique(home[ev.request_id == r]).size == 1
    f = online_figures(p, fit, ev, "dp")
    assert 0 < f["predicted_lar_mean"] <= 1
    assert set(f["accuracy"]) == {"token", "ngram", "combined"}


def test_evaluate_online_cli(tmp_path, data) -> None:
    write_trace(data[0], tmp_path / "t.parquet")
    run = lambda *a: subprocess.run([sys.executable, "-m", "sempar.cli", *a],  # noqa: E731
                                    capture_output=True, text=True, cwd=tmp_path)
    r = run("evaluate", "--fit", "t.parquet", "--split", "--ep", "4", "--methods",
            "vanilla,semmoe", "--online", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    for m in res["methods"].values():
        assert 0 < m["predicted_lar_mean"] <= 1 and len(m["predicted_lar"]) == 16
    # online scheduling helps even the vanilla placement: tokens go where their experts are
    assert res["methods"]["vanilla"]["predicted_lar_mean"] > res["methods"]["vanilla"]["lar_mean"]
    r = run("evaluate", "--fit", "t.parquet", "--split", "--ep", "4", "--online", "--policy", "x")
    assert r.returncode == 2 and "request policy" in r.stderr
