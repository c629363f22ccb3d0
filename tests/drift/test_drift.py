"""Drift streams from the shipped real traces and `sempar replay` over them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import sempar
from sempar.drift.policies import POLICIES, ReplayConfig
from sempar.drift.replay import replay, serve_figures
from sempar.drift.streams import GROUPS, drift_stream, phases, request_table
from sempar.drift.costs import expert_bytes, remote_activation_bytes
from sempar.placement.rebalance import RebalanceConfig
from sempar.trace import read_trace
from sempar.trace.io import write_trace

from conftest import run_cli

ASSETS = Path(sempar.__file__).parent / "assets" / "traces"
ESFT = ASSETS / "deepseek-v2-lite-esft.parquet"
MMLU = ASSETS / "gpt-oss-20b-mmlu.parquet"


@pytest.fixture(scope="module")
def esft():
    return read_trace(ESFT)


@pytest.fixture(scope="module")
def mmlu():
    return read_trace(MMLU)


def rows_multiset(t) -> np.ndarray:
    flat = t.experts.reshape(t.num_tokens, -1).astype(np.int64)
    return flat[np.lexsort(flat.T[::-1])]


def test_tasks_stream_is_the_esft_tasks_one_after_another(esft):
    s = drift_stream(esft, "tasks")
    assert [d for _, d in phases(s)] == ["intent", "law", "summary"]
    assert s.num_requests == esft.num_requests and s.num_tokens == esft.num_tokens
    assert np.array_equal(rows_multiset(s), rows_multiset(esft))   # reordered, nothing changed
    reqs, _, _, _ = request_table(s)
    assert np.array_equal(reqs, np.arange(s.num_requests))          # ids in arrival order


def test_groups_and_mixture_streams_of_mmlu(mmlu):
    assert all(d.replace(" ", "_") in GROUPS for d in mmlu.domains)   # no subject unmapped
    g = drift_stream(mmlu, "groups")
    assert sorted(d for _, d in phases(g)) == ["humanities", "other", "social", "stem"]
    m = drift_stream(mmlu, "mixture", switch_every=32, mix=0.8, seed=3)
    _, dom, _, _ = request_table(m)
    seg = dom[:32 * (dom.size // 32)].reshape(-1, 32)
    main = [np.bincount(s, minlength=4).argmax() for s in seg[:8]]
    assert main == [i % 4 for i in range(8)]                          # the mix switches each K
    assert np.array_equal(rows_multiset(m), rows_multiset(mmlu))


def test_drift_cli_refuses_a_trace_without_domains(tmp_path, trace):
    trace.domain, trace.domains = None, []
    write_trace(trace, tmp_path / "t.parquet")
    r = run_cli("drift", "--trace", tmp_path / "t.parquet", "--out", tmp_path / "s.parquet")
    assert r.returncode == 2 and "domain" in r.stderr and not (tmp_path / "s.parquet").exists()


def test_policies_are_registered_with_capabilities():
    assert POLICIES.names() == ["static", "resolve", "eplb-periodic", "sempar-incremental",
                                "vllm-eplb", "sglang-eplb", "sempar-engine"]
    assert POLICIES.get("static").update is None
    assert POLICIES.get("sempar-incremental").budgeted and POLICIES.get("resolve").full_layout
    assert not POLICIES.get("eplb-periodic").locality


@pytest.mark.slow
def test_replay_measures_every_step(esft):
    s = drift_stream(esft, "tasks")
    m = esft.meta.model
    rb = RebalanceConfig(max_moves=8, expert_bytes=expert_bytes(m),
                         remote_bytes=remote_activation_bytes(m))
    # the step budget (8 moves) on every update: a young stream's updates would take the event
    # budget (`young_budget`, test_events.py), and this short stream is young throughout
    cfg = ReplayConfig(ep=4, every=16, window=8, max_steps=3, rebalance=rb, young_budget=False)
    seen = []
    out = replay(s, ["static", "eplb-periodic", "sempar-incremental"], cfg,
                 on_step=lambda n, f, p: seen.append((n, f.step, p)))
    pol = out["policies"]
    assert set(pol) == {"static", "eplb-periodic", "sempar-incremental"} and out["steps"] == 3
    assert pol["static"]["migrated_bytes"] == 0
    inc = pol["sempar-incremental"]
    for st in inc["steps"][1:]:
        assert 0 < st["migrated_experts"] <= 2 * 8
        assert st["migrated_bytes"] == st["migrated_experts"] * expert_bytes(m)
    # the static policy's step 0 is the warm-up's sempar placement serving requests 8..23
    p0 = [p for n, i, p in seen if n == "static" and i == 0][0]
    _, _, rows, starts = request_table(s)
    lar, imb = serve_figures(p0, s.take(rows[starts[8]:starts[24]]).experts, 2048)
    assert pol["static"]["steps"][0]["lar"] == pytest.approx(lar)
    assert pol["static"]["steps"][0]["imbalance"] == pytest.approx(imb.mean())
    assert p0.method == "sempar" and p0.info["objective"] == "rows"


@pytest.mark.slow
def test_replay_cli_json_plot_and_placements_for_the_engines(esft, tmp_path):
    write_trace(drift_stream(esft, "tasks").take(np.arange(4000)), tmp_path / "s.parquet")
    r = run_cli("replay", "--trace", tmp_path / "s.parquet", "--ep", "4", "--policies",
                "eplb-periodic,sempar-incremental", "--every", "8", "--window", "6",
                "--max-steps", "2", "--max-moves", "4", "--json", "--plot", tmp_path / "plot",
                "--placements", tmp_path / "steps")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for p in out["policies"].values():
        assert {"lar_mean", "imbalance_p95", "migrated_bytes", "steps"} <= set(p)
    assert (tmp_path / "plot" / "replay.png").stat().st_size > 1000
    step = tmp_path / "steps" / "sempar-incremental" / "step-0001.json"
    e = run_cli("export", "--placement", step, "--to", "sglang", "--out", tmp_path / "sg.json")
    assert e.returncode == 0, e.stderr
    rows = json.loads((tmp_path / "sg.json").read_text())["physical_to_logical_map"]
    assert len(rows) == 27                        # one row per hidden layer, layer 0 dense
