"""`sempar capture` end to end against the loopback fixture server (tests/engine_fixture_server.py)
that runs tiny-moe64 / tiny-mixtral for real: the captured trace equals `sempar record`'s rows on
the same prompts (prefill rows: `sempar record` on the prompts' text; every row, decode included:
`sempar record`'s recorder on prompt + generated tokens), for both engines' wire formats; SIGTERM
mid-run leaves a valid partial trace and a second run completes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("uvicorn")
pytest.importorskip("pybase64")

sys.path.insert(0, str(Path(__file__).parents[0]))
from engine_fixture_server import Faults, FixtureServer, ModelBackend, make_app  # noqa: E402

from sempar.capture.job import decode_mask  # noqa: E402
from sempar.trace import read_trace  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["def add(x, y):\n    return x + y", "The river runs past the old mill at dawn.",
         "import numpy as np\narr = np.zeros(3)", "Dear committee, I write to apply.",
         "for i in range(10):\n    print(i)", "A short note."]


def cli(*args: str) -> int:
    from sempar.cli import main

    try:
        main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def prompts_files(tmp: Path) -> tuple[Path, Path]:
    """(JSON-lines prompts for capture, the same requests as a text file for record)."""
    jl, txt = tmp / "prompts.jsonl", tmp / "code.txt"
    jl.write_text("".join(json.dumps({"text": t, "domain": "code", "id": f"p{i}"}) + "\n"
                          for i, t in enumerate(TEXTS)))
    txt.write_text("\n\n".join(TEXTS) + "\n")
    return jl, txt


@pytest.fixture(scope="module", params=["tiny-moe64", "tiny-mixtral"])
def backend(request):
    return ModelBackend(request.param)


def rows(trace, mask=None):
    t = trace if mask is None else trace.take(mask)
    return t.token_id, t.request_id, t.position, t.experts


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_capture_equals_record(backend, engine, tmp_path):
    from sempar.models import load_model
    from sempar.trace.record import Requests, record_requests

    jl, txt = prompts_files(tmp_path)
    name = backend.source.name
    with FixtureServer(make_app(backend, Faults(), str(backend.source.model_dir))) as url:
        assert cli("capture", "--url", url, "--engine", engine, "--prompts", str(jl),
                   "--out", str(tmp_path / "cap.parquet"), "--model-dir", name,
                   "--max-new-tokens", "6", "--concurrency", "3") == 0
    cap = read_trace(tmp_path / "cap.parquet")
    decode = decode_mask(cap.meta, cap.request_id, cap.position)
    assert decode.sum() == 5 * len(TEXTS) and cap.num_requests == len(TEXTS)
    assert cap.meta.extra["capture"]["prompt_ids"] == [f"p{i}" for i in range(len(TEXTS))]
    # prefill rows == `sempar record` of the prompts' text (same tokenizer, same model)
    assert cli("record", "--model", name, "--text", f"{txt}:code", "--out",
               str(tmp_path / "rec.parquet"), "--batch-size", "1", "--no-weights") == 0
    rec = read_trace(tmp_path / "rec.parquet")
    for a, b in zip(rows(cap, ~decode), rows(rec)):
        np.testing.assert_array_equal(a, b)
    assert cap.domains == rec.domains == ["code"]
    # every row == the recorder run on prompt + generated tokens (the capture's token column)
    seqs = [cap.token_id[cap.request_id == r] for r in range(len(TEXTS))]
    record_requests(load_model(backend.source.model_dir), Requests(tokens=seqs),
                    tmp_path / "full.parquet", batch_size=1, weights=False)
    full = read_trace(tmp_path / "full.parquet")
    for a, b in zip(rows(cap), rows(full)):
        np.testing.assert_array_equal(a, b)
    assert cap.meta.layer_ids == full.meta.layer_ids
    assert cap.meta.num_experts == full.meta.num_experts and cap.meta.top_k == full.meta.top_k


def test_sigterm_leaves_a_valid_partial_trace_that_resumes(backend, tmp_path):
    if backend.source.name != "tiny-moe64":
        pytest.skip("one model is enough for the signal path")
    jl, _ = prompts_files(tmp_path)
    out = tmp_path / "cap.parquet"
    faults = Faults(delay_s=0.3)
    args = [sys.executable, "-m", "sempar.cli", "capture", "--engine", "sglang", "--prompts",
            str(jl), "--out", str(out), "--model-dir", "tiny-moe64", "--max-new-tokens", "4",
            "--concurrency", "1", "--requests", "12"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with FixtureServer(make_app(backend, faults, None)) as url:
        proc = subprocess.Popen(args + ["--url", url], env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while faults.served < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "interrupted" in err and "run the same command again" in err
        part = read_trace(out)                               # a valid trace: it reads back
        done = part.num_requests
        assert 1 <= done < 12
        np.testing.assert_array_equal(np.unique(part.request_id), np.arange(done))
        faults.delay_s = 0.0
        served = faults.served
        res = subprocess.run(args + ["--url", url], env=env, capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr
        assert faults.served - served == 12 - done           # only the missing requests sent
        whole = tmp_path / "whole.parquet"
        res = subprocess.run([a if a != str(out) else str(whole) for a in args] + ["--url", url],
                             env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
    a, b = read_trace(out), read_trace(whole)
    for x, y in zip(rows(a), rows(b)):
        np.testing.assert_array_equal(x, y)
    assert a.meta.extra["capture"]["prompt_tokens"] == b.meta.extra["capture"]["prompt_tokens"]
