"""`sempar rebalance` (placement/rebalance.py) and the migration figures, on the shipped real
traces (DeepSeek-V2-Lite ESFT prefill without token ids, GPT-OSS-20B MMLU decode with them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import sempar
from sempar.drift.streams import drift_stream, request_table
from sempar.placement import solve
from sempar.placement.metrics import placement_figures
from sempar.drift.costs import expert_bytes, remote_activation_bytes
from sempar.placement.migration import align_devices, copied_experts
from sempar.placement.rebalance import RebalanceConfig, placement_hash, rebalance
from sempar.placement.capacity import SEARCH_ASSIGN
from sempar.schedule.homes import oracle_home
from sempar.trace import read_trace
from sempar.trace.io import write_trace

from conftest import run_cli

ASSETS = Path(sempar.__file__).parent / "assets" / "traces"
ESFT = ASSETS / "deepseek-v2-lite-esft.parquet"
MMLU = ASSETS / "gpt-oss-20b-mmlu.parquet"


def requests(trace, a: int, b: int):
    """Requests a..b-1 of `trace` in arrival order."""
    _, _, rows, starts = request_table(trace)
    return trace.take(rows[starts[a]:starts[b]])


@pytest.fixture(scope="module")
def esft():
    """(fit: the first 12 intent requests, window: 12 law requests) of the tasks stream."""
    s = drift_stream(read_trace(ESFT), "tasks")
    return requests(s, 0, 12), requests(s, 127, 139)


def cfg_for(model: str, **kw) -> RebalanceConfig:
    return RebalanceConfig(expert_bytes=expert_bytes(model),
                           remote_bytes=remote_activation_bytes(model), **kw)


def exact(p, experts):
    # the step scores its moves with the solvers' search rule (greedy proposal rounds,
    # `capacity.SEARCH_ASSIGN`), not the evaluator's default optimal rule
    f = placement_figures(p, experts, oracle_home(p, experts, rule=SEARCH_ASSIGN))
    load = f["load"]
    return f["lar_mean"], load.max(axis=1) / load.mean(axis=1)


def test_moves_raise_the_windows_exact_lar_within_the_bound(esft):
    fit, window = esft
    cur = solve("eplb", fit, num_devices=4)
    cfg = cfg_for(fit.meta.model, max_moves=12)
    new, res = rebalance(cur, window.experts, cfg)
    assert 0 < len(res.moves) <= 12
    lar0, imb0 = exact(cur, window.experts)
    lar1, imb1 = exact(new, window.experts)
    # the step's own figures are the evaluator's, recomputed independently
    assert res.lar_before == pytest.approx(lar0) and res.lar_after == pytest.approx(lar1)
    assert lar1 > lar0
    assert np.all(imb1 <= np.maximum(imb0, cfg.max_imbalance) + 1e-9)
    # bytes: every copied (device, expert) pair, priced from the model's shape
    copies = int(copied_experts(cur, new).sum())
    assert copies == sum(m.copies for m in res.moves)
    assert res.copied_bytes == copies * expert_bytes("deepseek-v2-lite")
    assert expert_bytes("deepseek-v2-lite") == 3 * 2048 * 1408 * 2
    assert new.info["parent"] == placement_hash(cur) != placement_hash(new)
    assert all(m.payback_s is None or m.payback_s <= cfg.horizon_s for m in res.moves)


def test_balance_is_restored_first_and_unpaid_moves_are_skipped(esft):
    fit, window = esft
    cur = solve("vanilla", fit, num_devices=4)            # contiguous: drifts far above 1.10
    _, imb0 = exact(cur, window.experts)
    assert imb0.max() > 1.10
    cfg = cfg_for(fit.meta.model, max_moves=400, horizon_s=1e-9)   # no locality move pays
    new, res = rebalance(cur, window.experts, cfg)
    assert {m.reason for m in res.moves} == {"balance"}
    assert res.skipped_unpaid > 0
    _, imb1 = exact(new, window.experts)
    assert imb1.max() <= 1.10 + 1e-9


def test_byte_budget_and_replica_retargets(esft):
    fit, window = esft
    cur = solve("eplb", fit, num_devices=4, redundant=4)   # one replica slot per device
    eb = expert_bytes(fit.meta.model)
    cfg = cfg_for(fit.meta.model, max_moves=10_000, max_bytes=5 * eb)
    new, res = rebalance(cur, window.experts, cfg)
    assert 0 < res.copied_bytes <= 5 * eb
    assert int(copied_experts(cur, new).sum()) * eb == res.copied_bytes
    assert new.redundant == 4 and (new.logcnt() >= 1).all()
    free = rebalance(cur, window.experts, cfg_for(fit.meta.model, max_moves=60))[1]
    assert "retarget" in {m.kind for m in free.moves}


def test_works_on_a_trace_with_token_ids():
    t = read_trace(MMLU)
    assert t.meta.has_token_ids
    s = drift_stream(t, "groups")
    fit, window = requests(s, 0, 8), requests(s, 400, 408)
    cur = solve("eplb", fit, num_devices=8)
    new, res = rebalance(cur, window.experts, cfg_for(t.meta.model, max_moves=6))
    # the window (humanities after stem) is far above the bound: balance moves come first
    assert len(res.moves) == 6 and {m.reason for m in res.moves} == {"balance"}
    assert sum(res.imbalance_after) < sum(res.imbalance_before)
    assert res.lar_after == pytest.approx(exact(new, window.experts)[0])


def test_align_devices_keeps_experts_in_place(esft):
    fit, window = esft
    a = solve("eplb", fit, num_devices=4)
    b = solve("eplb", window, num_devices=4)
    c = align_devices(a, b)
    assert copied_experts(a, c).sum() <= copied_experts(a, b).sum()
    assert copied_experts(a, align_devices(a, a)).sum() == 0
    # same layout up to labels: the exact homes differ only where the home rule breaks ties by id
    assert exact(c, window.experts)[0] == pytest.approx(exact(b, window.experts)[0], abs=2e-3)


def test_cli_writes_the_next_placement_and_refuses_a_wrong_ep(esft, tmp_path):
    fit, window = esft
    write_trace(window, tmp_path / "w.parquet")
    solve("eplb", fit, num_devices=4).save(tmp_path / "cur.json")
    args = ["rebalance", "--placement", tmp_path / "cur.json", "--trace", tmp_path / "w.parquet",
            "--out", tmp_path / "next.json"]
    r = run_cli(*args, "--ep", "4", "--max-moves", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["num_moves"] <= 3 and out["expected_gain"] > 0
    nxt = json.loads((tmp_path / "next.json").read_text())
    assert nxt["info"]["parent"] == out["parent"]
    bad = run_cli(*args[:-1], tmp_path / "other.json", "--ep", "8")
    assert bad.returncode == 2 and "--ep 8" in bad.stderr and not (tmp_path / "other.json").exists()
