"""`sempar simulate` end to end: the --json contract, placements, topologies, --compare."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sempar.paths import assets_dir


def sempar(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sempar.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    from sempar.trace import read_trace, write_trace

    tr = read_trace(assets_dir() / "traces" / "tiny-moe64.parquet")
    keep = np.isin(tr.request_id, np.unique(tr.request_id)[:150])
    p = tmp_path_factory.mktemp("sim") / "small.parquet"
    write_trace(tr.take(keep), p)
    return p


def test_json_contract(small_trace):
    r = sempar("simulate", "--trace", str(small_trace), "--placement", "vanilla", "--pipeline",
               "semmoe-tp", "--topology", "a100x4-ib", "--json", cwd=small_trace.parent)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["pipeline"] == "smoe" and d["topology"] == "a100x4-ib" and d["devices"] == 8
    assert len(d["layers"]) == 6
    for L in d["layers"]:
        assert {"layer", "bytes", "a2a_seconds"} <= set(L)
        assert np.array(L["bytes_per_pair"]).shape == (8, 8)
    t = d["total"]
    assert {"bytes", "a2a_seconds_mean", "a2a_seconds_p95", "lar_mean"} <= set(t)
    assert t["bytes"] == pytest.approx(sum(L["bytes"] for L in d["layers"]))
    assert t["a2a_seconds_p95"] >= t["a2a_seconds_mean"] * 0.5 > 0
    assert 0.1 < t["lar_mean"] < 0.2                     # vanilla, 8 of 64 experts per device
    # SRS and SAG: each device sends (G-1)/G of the batch through each ring, per layer
    ring = t["bytes_by_phase"]["collectives"]
    tokens, H = t["tokens"], 128 * 2
    assert ring == pytest.approx(6 * 2 * 8 * 7 / 8 * tokens * H)


def test_placement_json_topology_json_and_errors(small_trace, tmp_path):
    from sempar.comm.topology_presets import topology_preset
    from sempar.placement import solve
    from sempar.trace import read_trace

    tr = read_trace(small_trace)
    solve("round-robin", tr, num_devices=4).save(tmp_path / "p4.json")
    topology_preset("pcie-upi8").save(tmp_path / "topo.json")
    solve("round-robin", tr, num_devices=8, num_nodes=2).save(tmp_path / "p8.json")
    r = sempar("simulate", "--trace", str(small_trace), "--placement", str(tmp_path / "p8.json"),
               "--pipeline", "attn-dp", "--topology", str(tmp_path / "topo.json"), "--json",
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["topology"] == "pcie-upi8" and d["metadata"] == "separate" and d["dedup"] is False
    assert d["total"]["bytes_by_phase"]["metadata"] > 0
    for args, msg in ((("--placement", str(tmp_path / "p4.json")), "4 devices"),
                      (("--pipeline", "nope"), "unknown pipeline"),
                      (("--topology", "nope"), "unknown topology"),
                      (("--topology", "nvlink8", "--nodes", "2"), "one server")):
        r = sempar("simulate", "--trace", str(small_trace), *args, cwd=tmp_path)
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_compare_json_writes_no_png_unasked(small_trace, tmp_path):
    r = sempar("simulate", "--trace", str(small_trace), "--placement", "vanilla",
               "--pipeline", "sglang-ep", "--topology", "pcie-upi8", "--compare", "--json",
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["png"] is None and list(tmp_path.glob("*.png")) == []


def test_compare_table_and_png(small_trace, tmp_path):
    png = tmp_path / "cmp.png"
    r = sempar("simulate", "--trace", str(small_trace), "--placement", "vanilla,semmoe",
               "--pipeline", "ds-moe,sglang-ep,sglang-tp", "--topology", "pcie-upi8,hetero-cloud:2",
               "--compare", "--png", str(png), "--hidden", "2048", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert png.stat().st_size > 10_000 and d["hidden"] == 2048
    rows = d["rows"]
    assert len(rows) == 2 * 3 * 2
    assert {r["topology"] for r in rows} == {"pcie-upi8", "hetero-cloud:2"}
    for r in rows:
        if r["method"] == "vanilla":
            assert r["comm_speedup"] == 1.0
            assert r["a2a_speedup"] == (None if r["pipeline"] == "sglang-tp" else 1.0)
        if r["pipeline"] == "sglang-tp":
            assert r["lar_mean"] is None and r["a2a_seconds_mean"] == 0
            assert r["comm_seconds_mean"] > 0
        if r["pipeline"] == "sglang-ep":
            assert r["scheduled"] is (r["method"] == "semmoe")
    # hetero-cloud's ms-scale inter-node links cost more than pcie-upi8's
    t = {(r["topology"], r["pipeline"], r["method"]): r["a2a_seconds_mean"] for r in rows}
    assert t[("hetero-cloud:2", "ds-moe", "vanilla")] > 10 * t[("pcie-upi8", "ds-moe", "vanilla")]
