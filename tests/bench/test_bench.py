"""sempar bench (sempar.bench; sempar.runtime executes): a tiny loopback run at G = 2 checks the
`bench --json` contract, the three times (MoE block and attention collectives within the layer,
per rank and max over ranks), measured bytes == the comm simulator's where the runtime matches it
exactly for every mode (attn-dp vs sglang-ep, tp-allreduce vs ds-moe, tp-rebatch vs smoe,
tp-exact vs smoe-exact, exflow vs exflow-prefill: dispatch copies carry their token index), lossless logits, LAR in (0, 1], the saved last
result and the demo rows; every runtime mode names a registered simulator pipeline; a testbed
run (root + netns) is marked slow and skipped elsewhere."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sempar import bench
from sempar.comm.pipelines import PIPELINES
from sempar.runtime import DISPATCHERS, MODES

KEYS = {"moe_layer_seconds", "forward_seconds", "bytes_sent", "bytes_predicted", "lar_mean",
        "max_abs_logit_diff", "moe_block_seconds", "attn_comm_seconds", "layer_seconds",
        "rank_seconds", "moe_block_ratio"}


def check_result(res: dict, G: int) -> None:
    assert {"hosts", "preset", "model", "methods"} <= set(res)
    assert res["hosts"] == G and res["model"] == "tiny-moe64"
    assert set(res["methods"]) == set(bench.METHODS) - set(res["skipped"])
    for name, m in res["methods"].items():
        assert KEYS <= set(m), name
        assert m["forward_seconds"] > 0 and 0 < m["moe_layer_seconds"] < m["forward_seconds"]
        assert 0 < m["lar_mean"] <= 1, name
        assert m["logits_allclose_1e-5"], name        # torch.allclose(rtol = atol = 1e-5)
        assert m["max_abs_logit_diff"] < 1e-4, name
        assert m["bytes_sent"] > 0
        # the logit all-reduce of exact pre-routing, counted and predicted alike
        assert m["prerouting_sent"] == m["prerouting_predicted"], name
        assert (m["prerouting_sent"] > 0) == (name == "sempar-tp-exact"), name
        assert m["bytes_sent"] == m["bytes_predicted"], name
    assert res["methods"]["vanilla"]["time_ratio"] == 1.0
    assert res["methods"]["vanilla"]["moe_block_ratio"] == 1.0
    check_times(res, G)


def check_times(res: dict, G: int) -> None:
    """The MoE block and the attention collectives are parts of the layer, on every rank and in
    the max over ranks; the DP modes have attention collectives only in exflow."""
    for name, m in res["methods"].items():
        per = m["rank_seconds"]
        assert set(per) == {"layer", "moe_block", "attn_comm"}, name
        assert all(len(v) == G for v in per.values()), name
        for r in range(G):
            assert 0 < per["moe_block"][r] <= per["layer"][r], (name, r)
            assert 0 <= per["attn_comm"][r] <= per["layer"][r], (name, r)
            assert per["moe_block"][r] + per["attn_comm"][r] <= per["layer"][r] * (1 + 1e-9), \
                (name, r)
        assert 0 < m["moe_block_seconds"] <= m["layer_seconds"] == m["moe_layer_seconds"], name
        # mean over layers of the max over ranks >= every rank's mean over layers
        for b, key in (("layer", "layer_seconds"), ("moe_block", "moe_block_seconds"),
                       ("attn_comm", "attn_comm_seconds")):
            assert m[key] >= max(per[b]) * (1 - 1e-9), (name, b)
        tp_or_exflow = m["mode"].startswith("tp") or m["mode"] == "exflow"
        assert (m["attn_comm_seconds"] > 0) == tp_or_exflow, name


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "last.json"
    mp = pytest.MonkeyPatch()
    mp.setenv("SEMPAR_BENCH_RESULT", str(path))
    try:
        yield bench.run_bench(G=2, preset="none", batches=1, batch_size=2, seq=16, repeats=1,
                              timeout_s=240), path
    finally:
        mp.undo()


def test_loopback_contract_bytes_lar(loopback):
    res, _ = loopback
    assert res["preset"] is None and res["transport"] == "loopback"
    check_result(res, 2)


def test_last_result_and_rows(loopback, monkeypatch):
    res, path = loopback
    monkeypatch.setenv("SEMPAR_BENCH_RESULT", str(path))
    assert bench.result_path() == path
    assert bench.last_bench_result() == json.loads(json.dumps(res))
    rows = bench.bench_table_rows(bench.last_bench_result())
    assert len(rows) == len(res["methods"]) and all(len(r) == len(bench.TABLE_HEADER)
                                                    for r in rows)
    monkeypatch.setenv("SEMPAR_BENCH_RESULT", str(path.parent / "missing.json"))
    assert bench.last_bench_result() is None


def test_cli_bad_input():
    from sempar.cli import app
    from sempar.errors import InputError

    r = CliRunner().invoke(app, ["bench", "--hosts", "2", "--preset", "none", "--methods",
                                 "nope"])
    assert isinstance(r.exception, InputError) and "nope" in str(r.exception)


def test_every_mode_names_a_pipeline_and_every_method_a_mode():
    assert set(MODES) == set(DISPATCHERS) == {"attn-dp", "tp-allreduce", "tp-rebatch",
                                              "tp-exact", "exflow"}
    for mode in DISPATCHERS:
        cls = DISPATCHERS.get(mode)
        assert cls.name == mode and cls.pipeline in PIPELINES, mode
        pipe = PIPELINES.get(cls.pipeline)
        assert pipe.expert_parallel, mode
        assert (pipe.attention == "tp") == cls.tensor_parallel, mode
    for name in bench.METHODS:
        m = bench.METHODS.get(name)
        assert m.mode in DISPATCHERS and m.pipeline == DISPATCHERS.get(m.mode).pipeline, name


def test_tp_skipped_when_heads_do_not_split():
    assert bench.tp_ok("tiny-moe64", 4) and not bench.tp_ok("tiny-moe64", 8)


@pytest.mark.slow
def test_testbed_run(tmp_path, monkeypatch):
    from sempar.testbed.netns import netns_available

    ok, why = netns_available()
    if not ok:
        pytest.skip(f"testbed unavailable: {why}")
    monkeypatch.setenv("SEMPAR_BENCH_RESULT", str(tmp_path / "last.json"))
    res = bench.run_bench(G=2, preset="pcie-upi8", batches=1, batch_size=2, seq=16, repeats=1,
                          timeout_s=240)
    assert res["preset"] == "pcie-upi8" and res["transport"] == "testbed"
    check_result(res, 2)
