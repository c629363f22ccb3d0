"""sempar bench (sempar.runtime.bench): a tiny loopback run at G = 2 checks the `bench --json`
contract, measured bytes == the comm simulator's where the runtime matches it exactly (attn-dp
vs sglang-ep, tp-allreduce vs ds-moe, tp-rebatch vs smoe, tp-exact vs smoe-exact; exflow: + 4 B per dispatched copy),
lossless logits, LAR in (0, 1], the saved last result and the demo rows; a testbed run (root +
netns) is marked slow and skipped elsewhere."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sempar.runtime import bench

KEYS = {"moe_layer_seconds", "forward_seconds", "bytes_sent", "bytes_predicted", "lar_mean",
        "max_abs_logit_diff"}
EXACT = ("vanilla", "vanilla-tp", "sempar-dp", "sempar-tp", "sempar-tp-exact")


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
        if name in EXACT:
            assert m["bytes_sent"] == m["bytes_predicted"], name
        else:   # exflow: the global token index, 4 B per copy of 4H + 8k = 576 B
            extra = m["dispatch_predicted"] * 4 / 576
            assert m["bytes_sent"] == pytest.approx(m["bytes_predicted"] + extra), name
    assert res["methods"]["vanilla"]["time_ratio"] == 1.0


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
