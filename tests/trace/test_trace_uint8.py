"""Expert ids are uint8 in memory when a model has at most 256 experts (TraceMeta.expert_dtype):
every verb must give the same figures as with the ids held as int16 (what the files store).

A trace with 256 experts uses ids up to 255, where uint8 arithmetic wraps (`e * N`, `e + 1`,
-1 sentinels, torch index tensors). Each verb (place with several solvers, evaluate with the
online schedulers, simulate over the pipelines, analyze, export, stream; the predictors by
API) runs in-process twice on the same file, once as is and once with TraceMeta.expert_dtype
forced to the stored int16, and their JSON outputs and written files are compared whole (only
the solvers' wall-clock seconds removed).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from conftest import build_trace
from sempar.cli import app
from sempar.trace import TraceMeta, read_trace, write_trace

# keys whose values are wall-clock measurements of this run, not figures
_WALL_CLOCK = {"solve_seconds", "seconds", "wall_seconds", "bound_seconds"}


def _figures(x):
    if isinstance(x, dict):
        return {k: _figures(v) for k, v in x.items() if k not in _WALL_CLOCK}
    if isinstance(x, list):
        return [_figures(v) for v in x]
    return x


@pytest.fixture(scope="module")
def wide_trace(tmp_path_factory) -> Path:
    """256 experts in 8 groups (at most 4 per token), top-8, 3 layers: ids span 0..255."""
    t = build_trace(T=1200, R=40, L=3, N=256, k=8, vocab=300, groups=(8, 4), seed=3)
    assert t.experts.dtype == np.uint8 and int(t.experts.max()) == 255
    path = tmp_path_factory.mktemp("wide") / "wide.parquet"
    write_trace(t, path)
    return path


def _run(args: list[str], int16: bool, monkeypatch, out_dir: Path) -> dict:
    with monkeypatch.context() as m:
        if int16:
            m.setattr(TraceMeta, "expert_dtype", property(lambda self: self.stored_dtype))
        r = CliRunner().invoke(app, [a.replace("{out}", str(out_dir)) for a in args])
    assert r.exit_code == 0, r.output
    files = {p.name: p.read_bytes() for p in sorted(out_dir.glob("*")) if p.is_file()
             and p.suffix in (".json", ".csv", ".txt")}
    text = r.stdout.strip().replace(str(out_dir), "{out}")
    return {"stdout": _figures(json.loads(text)) if text.startswith("{") else text,
            "files": {k: (_figures(json.loads(v)) if k.endswith(".json") else v)
                      for k, v in files.items()}}


def _same(args: list[str], monkeypatch, tmp_path: Path) -> dict:
    a = _run(args, False, monkeypatch, (tmp_path / "u8").resolve())
    b = _run(args, True, monkeypatch, (tmp_path / "i16").resolve())
    assert a == b, _differences(a, b)
    return a


def _differences(a, b, path: str = "") -> list[str]:
    """The paths at which two JSON-like values differ (the assertion's message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"[:300]]


def test_read_is_uint8_and_int16_when_forced(wide_trace, monkeypatch):
    t = read_trace(wide_trace)
    assert t.experts.dtype == np.uint8
    with monkeypatch.context() as m:
        m.setattr(TraceMeta, "expert_dtype", property(lambda self: self.stored_dtype))
        t16 = read_trace(wide_trace)
    assert t16.experts.dtype == np.int16 and np.array_equal(t.experts, t16.experts)


@pytest.mark.parametrize("method", ["sempar", "semmoe", "eplb", "metis", "vanilla", "smoe-cem"])
def test_place(method, wide_trace, monkeypatch, tmp_path):
    for d in ("u8", "i16"):
        (tmp_path / d).mkdir()
    _same(["place", "--trace", str(wide_trace), "--method", method, "--ep", "8", "--nodes", "2",
           "--out", "{out}/placement.json"], monkeypatch, tmp_path)


def test_place_redundant_dp(wide_trace, monkeypatch, tmp_path):
    for d in ("u8", "i16"):
        (tmp_path / d).mkdir()
    _same(["place", "--trace", str(wide_trace), "--method", "sempar", "--ep", "8",
           "--redundant", "8", "--mode", "dp", "--out", "{out}/placement.json"],
          monkeypatch, tmp_path)
    _same(["place", "--trace", str(wide_trace), "--method", "sempar", "--ep", "8",
           "--preserve-groups", "--out", "{out}/groups.json"], monkeypatch, tmp_path)


def test_evaluate_online(wide_trace, monkeypatch, tmp_path):
    out = _same(["evaluate", "--fit", str(wide_trace), "--split", "--ep", "8", "--methods",
                 "vanilla,semmoe",
                 "--online", "--json"], monkeypatch, tmp_path)
    assert out["stdout"]


def test_evaluate_dp(wide_trace, monkeypatch, tmp_path):
    _same(["evaluate", "--fit", str(wide_trace), "--split", "--ep", "8", "--mode", "dp",
           "--methods", "vanilla,eplb,semmoe", "--online", "--json"], monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def wide_placement(wide_trace, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pl") / "placement.json"
    r = CliRunner().invoke(app, ["place", "--trace", str(wide_trace), "--method", "eplb",
                                 "--ep", "8", "--redundant", "8", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("pipeline", ["ds-moe", "smoe", "smoe-exact", "attn-dp", "exflow",
                                      "sglang-ep"])
def test_simulate(pipeline, wide_trace, wide_placement, monkeypatch, tmp_path):
    _same(["simulate", "--trace", str(wide_trace), "--placement", str(wide_placement),
           "--pipeline", pipeline, "--topology", "pcie-upi8", "--hidden", "64", "--batch", "256",
           "--json"], monkeypatch, tmp_path)


def test_simulate_compare(wide_trace, monkeypatch, tmp_path):
    _same(["simulate", "--trace", str(wide_trace), "--compare", "--placement",
           "vanilla,eplb,semmoe", "--pipeline", "ds-moe,smoe", "--topology", "pcie-upi8",
           "--hidden", "64", "--batch", "256", "--png", "{out}/c.png", "--json"],
          monkeypatch, tmp_path)


def test_analyze(wide_trace, monkeypatch, tmp_path):
    _same(["analyze", str(wide_trace), "--ep", "8", "--control", "--out", "{out}", "--json"],
          monkeypatch, tmp_path)


def test_export(wide_trace, monkeypatch, tmp_path):
    for d in ("u8", "i16"):
        (tmp_path / d).mkdir()
    _same(["place", "--trace", str(wide_trace), "--method", "eplb", "--ep", "8",
           "--out", "{out}/placement.json"], monkeypatch, tmp_path)
    for to, extra in (("sglang", ["--num-hidden-layers", "3"]), ("vllm", [])):
        _same(["export", "--placement", "{out}/placement.json", "--to", to,
               "--out", "{out}/" + to + ".json", "--json", *extra], monkeypatch, tmp_path)


def test_stream(wide_trace, monkeypatch, tmp_path):
    _same(["stream", "--trace", str(wide_trace), "--model", "deepseek-moe-16b",
           "--tokens-per-iter", "16", "--iterations", "5", "--strategy", "all", "--json"],
          monkeypatch, tmp_path)


def _predictions(path: Path) -> list:
    from sempar.placement import solve
    from sempar.predict import DeviceNgram, ExpertConfidence, TokenDevice, prediction_accuracy
    from sempar.predict.expected_hits import ExpectedHits
    from sempar.trace import split_by_request

    fit, ev = split_by_request(read_trace(path), 0.5, seed=0)
    p = solve("eplb", fit, num_devices=8, num_nodes=1)
    ec = ExpertConfidence().fit(fit)
    vocab = np.arange(fit.meta.vocab_size)          # unseen tokens too: padded with -1
    td, ng = TokenDevice().fit(fit, p), DeviceNgram().fit(fit, p)
    acc = prediction_accuracy(ev, p, td, ng)
    return [[ec.predict(vocab, l) for l in range(fit.meta.num_layers)],
            [ec.predict_proba(vocab, l) for l in range(fit.meta.num_layers)],
            td.predict(vocab), ng.predict_trace(ev), acc,
            vars(ExpectedHits().fit(fit, p))]


def test_predictors(wide_trace, monkeypatch):
    a = _predictions(wide_trace)
    with monkeypatch.context() as m:
        m.setattr(TraceMeta, "expert_dtype", property(lambda self: self.stored_dtype))
        b = _predictions(wide_trace)
    assert (a[0][0] == -1).any()                    # the padding is exercised
    np.testing.assert_equal(a, b)


def test_serve_sim_dev_trace(monkeypatch, tmp_path, small_trace):
    """serve-sim on the tiny-moe64 dev trace (64 experts: uint8 ids), which has its model's
    dimensions (the 256-expert trace has no preset of its shape): its first 400 requests
    (conftest's `small_trace`; the dtype, not the size, is the point)."""
    assert read_trace(small_trace).experts.dtype == np.uint8
    _same(["serve-sim", "--trace", str(small_trace), "--topology", "pcie-upi8", "--ep", "8",
           "--systems", "sglang,semmoe-dp,semmoe-tp", "--rates", "1,4", "--duration", "5",
           "--json"], monkeypatch, tmp_path)
