"""`sempar capture` / `sempar import sglang-routed|vllm-routed` refusals and transient failures,
against the loopback fixture server (tests/engine_fixture_server.py) with random routing of
tiny-moe64's shape (6 MoE layers, 64 experts, top-8): each refusal is one line, exit 2, and
nothing is written."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("pybase64")
sys.path.insert(0, str(Path(__file__).parents[0]))
from engine_fixture_server import (Faults, FixtureServer, RandomBackend, make_app,  # noqa: E402
                                   needs_vllm, sglang_b64, vllm_b64)

from sempar.trace import read_trace  # noqa: E402


def cli(capsys, *args: str) -> tuple[int, str]:
    from sempar.cli import main

    capsys.readouterr()
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


@pytest.fixture
def prompts(tmp_path) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"input_ids": list(range(5 + i, 12 + 2 * i)),
                                     "domain": ["a", "b"][i % 2]}) + "\n" for i in range(6)))
    return p


def serve(faults: Faults):
    return FixtureServer(make_app(RandomBackend(6, list(range(6)), 8, 64), faults))


def capture(capsys, url, engine, prompts, out, *extra):
    return cli(capsys, "capture", "--url", url, "--engine", engine, "--prompts", str(prompts),
               "--out", str(out), "--model-dir", "tiny-moe64", "--max-new-tokens", "3",
               "--tries", "1", *extra)


@pytest.mark.parametrize("engine", ["sglang", "vllm",
                                    pytest.param("vllm-openai", marks=needs_vllm)])
def test_capture_writes_prefill_and_decode_rows(capsys, tmp_path, prompts, engine):
    with serve(Faults()) as url:
        code, err = capture(capsys, url, engine, prompts, tmp_path / "t.parquet", "--json")
    assert code == 0, err
    t = read_trace(tmp_path / "t.parquet")
    assert t.num_requests == 6 and t.domains == ["a", "b"]
    lens = t.meta.extra["capture"]["prompt_tokens"]
    assert lens == [7 + i for i in range(6)]
    assert t.num_tokens == sum(lens) + 6 * 2                # M - 1 = 2 decode rows each
    first = t.token_id[t.request_id == 0]
    assert first.tolist() == list(range(5, 12)) + [10, 11]  # prompt + output but the last


def one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_server_unreachable(capsys, tmp_path, prompts, engine):
    with socket.socket() as s:                   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, err = capture(capsys, f"http://127.0.0.1:{port}", engine, prompts, tmp_path / "t.parquet")
    assert code == 2 and "unreachable" in one_line(err)
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_server_without_the_flag(capsys, tmp_path, prompts, engine):
    with serve(Faults(flag=False)) as url:
        code, err = capture(capsys, url, engine, prompts, tmp_path / "t.parquet")
    assert code == 2 and "--enable-return-routed-experts" in one_line(err)
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("engine, version", [("sglang", "0.4.9"), ("vllm", "0.9.2")])
def test_unknown_engine_version(capsys, tmp_path, prompts, engine, version):
    with serve(Faults(version=version)) as url:
        code, err = capture(capsys, url, engine, prompts, tmp_path / "t.parquet")
    assert code == 2 and f"{version}: its routed-expert format is not one sempar knows" in one_line(err)
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("engine, mode, match", [
    ("sglang", "short", "not a multiple"), ("sglang", "out_of_range", "is outside 0..63"),
    ("sglang", "huge", "larger than"), ("vllm", "short", "shape"),
    ("vllm", "out_of_range", "is outside 0..63"), ("vllm", "pickle", "not a plain integer"),
    ("vllm", "float", "not a plain integer"), ("vllm", "fortran", "Fortran"),
    ("vllm", "huge", "rows"),
    ("sglang", "bloat", "larger than any answer to this request"),
])
def test_hostile_or_mismatched_payloads(capsys, tmp_path, prompts, engine, mode, match):
    with serve(Faults(payload=mode)) as url:
        code, err = capture(capsys, url, engine, prompts, tmp_path / "t.parquet")
    assert code == 2 and match in one_line(err), err
    assert not (tmp_path / "t.parquet").exists()


def test_transient_errors_are_retried(capsys, tmp_path, prompts):
    faults = Faults(fail_first=3)
    with serve(faults) as url:
        code, err = capture(capsys, url, "sglang", prompts, tmp_path / "t.parquet", "--tries",
                            "4", "--concurrency", "1")
    assert code == 0, err
    assert read_trace(tmp_path / "t.parquet").num_requests == 6


def test_a_failure_after_some_requests_keeps_them_and_resumes(capsys, tmp_path, prompts):
    out = tmp_path / "t.parquet"
    faults = Faults()
    with serve(faults) as url:
        code, _ = capture(capsys, url, "sglang", prompts, out, "--concurrency", "1",
                          "--requests", "3")
        assert code == 0
        code, err = capture(capsys, url, "sglang", prompts, out, "--concurrency", "1")
    assert code == 2 and "another requests" in one_line(err)     # settings differ: refused
    assert read_trace(out).num_requests == 3


def test_a_bad_block_mid_run_keeps_the_prefix_and_resumes(capsys, tmp_path, prompts, monkeypatch):
    """A response the trace's checks refuse (an expert twice in one top-k) after 2 requests were
    written: exit 2, the trace holds exactly those 2 (its prompt lengths too), and the same
    command completes it once the server answers right."""
    import sempar.capture.job as job

    monkeypatch.setattr(job, "FLUSH_ROWS", 1)             # one block per request
    out = tmp_path / "t.parquet"
    faults = Faults(duplicate_after=2)
    with serve(faults) as url:
        code, err = capture(capsys, url, "sglang", prompts, out, "--concurrency", "1")
        assert code == 2 and "kept 2 of 6 requests" in one_line(err), err
        part = read_trace(out)
        assert part.num_requests == 2 and len(part.meta.extra["capture"]["prompt_tokens"]) == 2
        faults.duplicate_after = None
        code, err = capture(capsys, url, "sglang", prompts, out, "--concurrency", "1")
    assert code == 0, err
    whole = read_trace(out)
    assert whole.num_requests == 6 and whole.meta.extra["capture"]["prompt_tokens"] == \
        [7 + i for i in range(6)]
    np.testing.assert_array_equal(np.unique(whole.request_id), np.arange(6))


def test_out_that_is_another_trace_is_refused(capsys, tmp_path, prompts):
    out = tmp_path / "t.parquet"
    with serve(Faults()) as url:
        assert capture(capsys, url, "sglang", prompts, out)[0] == 0
        other = tmp_path / "other.jsonl"
        other.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
        code, err = capture(capsys, url, "sglang", other, out)
    assert code == 2 and "another prompts_sha256" in one_line(err)


def test_bad_prompts(capsys, tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"input_ids": [1, 2]}\n{"text": "x", "input_ids": [1]}\n')
    with serve(Faults()) as url:
        code, err = capture(capsys, url, "sglang", p, tmp_path / "t.parquet")
    assert code == 2 and "line 2: give exactly one of text, input_ids" in one_line(err)


# ---- import sglang-routed / vllm-routed -------------------------------------------------------

def saved_lines(engine: str, n: int) -> tuple[list[str], list[np.ndarray]]:
    """n saved {"request", "response"} lines of tiny-moe64's shape and the routing in each."""
    rng = np.random.default_rng(1)
    lines, routing = [], []
    for i in range(n):
        P, M = 4 + i, 3
        arr = np.argsort(rng.random((P + M - 1, 6, 64)), axis=2)[:, :, :8].astype(np.int32)
        prompt = list(range(100, 100 + P))
        if engine == "sglang":
            req = {"input_ids": prompt, "return_routed_experts": True}
            resp = {"output_ids": [7, 8, 9], "meta_info": {
                "prompt_tokens": P, "completion_tokens": M, "routed_experts": sglang_b64(arr)}}
        else:
            req = {"token_ids": prompt, "sampling_params": {"max_tokens": M}}
            resp = {"choices": [{"index": 0, "token_ids": [7, 8, 9],
                                 "routed_experts": vllm_b64(arr.astype(np.uint8))}]}
        lines.append(json.dumps({"request": req, "response": resp, "domain": "d"}))
        routing.append(arr)
    return lines, routing


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_import_routed(capsys, tmp_path, engine):
    lines, routing = saved_lines(engine, 4)
    f = tmp_path / "responses.jsonl"
    f.write_text("\n".join(lines) + "\n")
    code, err = cli(capsys, "import", f"{engine}-routed", str(f), "--out",
                    str(tmp_path / "t.parquet"), "--model-dir", "tiny-moe64")
    assert code == 0, err
    t = read_trace(tmp_path / "t.parquet")
    np.testing.assert_array_equal(t.experts, np.concatenate(routing))
    assert t.domains == ["d"] and t.meta.extra["capture"]["prompt_tokens"] == [4, 5, 6, 7]
    assert t.token_id[t.request_id == 0].tolist() == [100, 101, 102, 103, 7, 8]


def test_import_without_prompt_ids_is_refused(capsys, tmp_path):
    lines, _ = saved_lines("sglang", 1)
    f = tmp_path / "responses.jsonl"
    f.write_text(json.dumps(json.loads(lines[0])["response"]) + "\n")
    code, err = cli(capsys, "import", "sglang-routed", str(f), "--out",
                    str(tmp_path / "t.parquet"), "--model-dir", "tiny-moe64")
    assert code == 2 and "no prompt token ids" in one_line(err)
    assert not (tmp_path / "t.parquet").exists()
