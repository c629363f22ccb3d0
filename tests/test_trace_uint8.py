"""Expert ids are uint8 in memory when a model has at most 256 experts (TraceMeta.expert_dtype):
every verb must give the same figures as with the ids held as int16 (what the files store).

A trace with 256 experts uses ids up to 255, where uint8 arithmetic wraps (`e * N`, `e + 1`,
-1 sentinels, torch index tensors). Each verb runs in-process twice on the same file, once as
is and once with TraceMeta.expert_dtype forced to the stored int16, and their JSON outputs and
written files are compared whole (timings removed).
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

# keys whose values are wall-clock measurements, not figures
_TIMING = ("seconds", "_s", "time", "elapsed")


def _figures(x):
    if isinstance(x, dict):
        return {k: _figures(v) for k, v in x.items()
                if not any(t in k for t in _TIMING if k.endswith(t) or t == "seconds")}
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
    text = r.stdout.strip()
    return {"stdout": _figures(json.loads(text)) if text.startswith("{") else text,
            "files": {k: (_figures(json.loads(v)) if k.endswith(".json") else v)
                      for k, v in files.items()}}


def _same(args: list[str], monkeypatch, tmp_path: Path) -> dict:
    a = _run(args, False, monkeypatch, (tmp_path / "u8").resolve())
    b = _run(args, True, monkeypatch, (tmp_path / "i16").resolve())
    assert a == b
    return a


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
                 "vanilla,round-robin,eplb,metis,kmeans2d,semmoe,sempar,smoe-cem,oracle",
                 "--online", "--json"], monkeypatch, tmp_path)
    assert out["stdout"]


def test_evaluate_dp(wide_trace, monkeypatch, tmp_path):
    _same(["evaluate", "--fit", str(wide_trace), "--split", "--ep", "8", "--mode", "dp",
           "--methods", "vanilla,eplb,semmoe", "--online", "--json"], monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def wide_placement(wide_trace, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pl") / "placement.json"
    r = CliRunner().invoke(app, ["place", "--trace", str(wide_trace), "--method", "semmoe",
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
    for to in ("sglang", "vllm"):
        _same(["export", "--placement", "{out}/placement.json", "--to", to,
               "--out", "{out}/" + to + ".json", "--json"], monkeypatch, tmp_path)


def test_stream(wide_trace, monkeypatch, tmp_path):
    _same(["stream", "--trace", str(wide_trace), "--model", "deepseek-moe-16b",
           "--tokens-per-iter", "16", "--iterations", "5", "--strategy", "all", "--json"],
          monkeypatch, tmp_path)


def test_serve_sim(wide_trace, monkeypatch, tmp_path):
    _same(["serve-sim", "--trace", str(wide_trace), "--preset", "deepseek-v3", "--ep", "8",
           "--systems", "sglang,semmoe-dp,semmoe-tp", "--rates", "1,4", "--duration", "5", "--json"],
          monkeypatch, tmp_path)


def test_dtypes_by_expert_count():
    def meta(n):
        return TraceMeta(model="m", num_layers=1, num_experts=n, top_k=1, vocab_size=10)
    assert (meta(256).expert_dtype, meta(256).stored_dtype) == (np.uint8, np.int16)
    assert (meta(257).expert_dtype, meta(257).stored_dtype) == (np.int16, np.int16)
    assert (meta(40000).expert_dtype, meta(40000).stored_dtype) == (np.int32, np.int32)


@pytest.mark.parametrize("version", [1, 2])
def test_files_store_int16_and_read_back_equal(version, tmp_path, monkeypatch):
    """The on-disk ids stay int16 whatever the in-memory dtype: the same trace written from
    uint8 and from int16 ids gives identical files."""
    import pyarrow.parquet as pq

    t = build_trace(T=100, R=10, N=256, k=4, seed=1)
    write_trace(t, tmp_path / "u8.parquet", format_version=version)
    t.experts = t.experts.astype(np.int16)
    write_trace(t, tmp_path / "i16.parquet", format_version=version)
    a, b = (pq.read_table(tmp_path / f).column("experts") for f in ("u8.parquet", "i16.parquet"))
    assert a.equals(b)
    if version == 1:
        assert a.type.value_type == pa.int16()
    else:   # L 3 x k 4 ids of 2 bytes
        assert a.type.byte_width == 3 * 4 * 2
    r = read_trace(tmp_path / "u8.parquet")
    assert r.experts.dtype == np.uint8 and np.array_equal(r.experts, t.experts)


@pytest.mark.parametrize("version", [1, 2])
def test_id_256_is_refused_not_wrapped(version, tmp_path):
    """An id of 256 in an int16 file of a 256-expert model would read as 0 in uint8: the range
    check runs on the stored ids before they are narrowed."""
    from conftest import write_unchecked
    from sempar.errors import InputError

    t = build_trace(T=100, R=10, N=256, k=4, seed=2, weights=False)
    t.experts = t.experts.astype(np.int16)
    t.experts[57, 2, 1] = 256
    write_unchecked(t, tmp_path / "bad.parquet", format_version=version)
    with pytest.raises(InputError, match=r"^experts: row 57 layer 2 slot 1: expert id 256 out of "
                                         r"range \[0, 256\)"):
        read_trace(tmp_path / "bad.parquet")


def test_dev_traces_same_as_int16(monkeypatch):
    from sempar.paths import dev_trace_paths

    for p in dev_trace_paths():
        t = read_trace(p)
        with monkeypatch.context() as m:
            m.setattr(TraceMeta, "expert_dtype", property(lambda self: self.stored_dtype))
            t16 = read_trace(p)
        assert t.experts.dtype == np.uint8 and t16.experts.dtype == np.int16
        assert np.array_equal(t.experts, t16.experts)
