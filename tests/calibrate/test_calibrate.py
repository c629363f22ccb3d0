"""sempar calibrate (issue 36): profiles, the forecast's use of them, check / convert, and the
verb's light import path (the GPU machine has only torch, numpy, typer, rich, scipy, pyarrow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sempar.serving.accel_profile import (build_profile, load_profile, profile_from_json,
                                          shipped_profile)
from sempar.serving.dims import model_dims
from sempar.serving.hardware import ACCELERATORS
from sempar.serving.roofline import Roofline

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "h100-kernels"
KERNEL_FILES = [SHARED / "moe_roofline.jsonl", SHARED / "attn_roofline.jsonl"]
BLOCKED = ("pymetis", "numba", "orjson", "starlette", "uvicorn", "aiohttp", "prometheus_client",
           "transformers", "sglang", "vllm", "hypothesis", "matplotlib", "safetensors")


def _run(*args, env_extra=None, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env_extra or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def test_cpu_calibrate_writes_a_profile_serve_sim_accepts(tmp_path, small_trace):
    """`calibrate --device cpu` (its import path blocked from the heavy optional packages)
    writes a profile and lines; serve-sim --accelerator-profile uses it and says so."""
    block = ("import sys, importlib.abc, runpy\n"
             "class B(importlib.abc.MetaPathFinder):\n"
             "    def find_spec(self, name, path, target=None):\n"
             f"        if name.split('.')[0] in {BLOCKED!r}: raise ImportError('blocked ' + name)\n"
             "sys.meta_path.insert(0, B())\n"
             "sys.argv = ['sempar'] + sys.argv[1:]\n"
             "runpy.run_module('sempar', run_name='__main__')\n")
    prof, lines = tmp_path / "cpu.json", tmp_path / "cpu.jsonl"
    r = _run("-c", block, "calibrate", "--device", "cpu", "--out", str(prof),
             "--measurements-out", str(lines), "--reps", "3", "--warmup", "1", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["measured"] == res["planned"] > 0
    p = load_profile(prof)
    assert p.source["kind"] == "measured" and p.accelerator == "cpu"
    assert {e.op for e in p.entries} == {"moe_block", "attention", "lm_head"}
    # the check reproduces its own measurements (the profile interpolates through them)
    r = _run("-m", "sempar", "calibrate", "check", "--accelerator", "cpu",
             "--accelerator-profile", str(prof), "--measurements", str(lines), "--json")
    assert r.returncode == 0, r.stderr
    chk = json.loads(r.stdout)
    assert chk["max_abs_error"] < 1e-3 and len(chk["lines"]) == res["measured"]
    r = _run("-m", "sempar", "serve-sim", "--trace", str(small_trace), "--accelerator", "cpu",
             "--accelerator-profile", str(prof), "--systems", "sglang", "--rates", "50,100",
             "--duration", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "measured on" in out["compute_model"] and str(prof) in out["compute_model"]


def test_bad_profile_is_one_line(tmp_path):
    bad = tmp_path / "p.json"
    good = json.loads((ROOT / "src/sempar/assets/accelerators/h100.json").read_text())
    good["entries"][0]["measured_us"][0] = -1
    bad.write_text(json.dumps(good))
    r = _run("-m", "sempar", "calibrate", "check", "--accelerator", "h100",
             "--accelerator-profile", str(bad), "--measurements", str(bad))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "entries[0]" in r.stderr


def _points(paths):
    from sempar.calibrate.lines import read_lines

    return [pt for p in paths for pt in read_lines(p)[1]]


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/data/h100-kernels absent")
def test_shipped_h100_profile_is_the_converted_measurements_and_meets_the_targets():
    from sempar.calibrate.check import check, convert

    lines = _points(KERNEL_FILES)
    shipped = shipped_profile("h100")
    assert shipped is not None
    acc = ACCELERATORS.get("h100")
    if shipped.source.get("kind") == "converted":     # rebuilt from the files, not retyped
        again = convert(lines, "h100", shipped.source)
        assert again.to_json()["entries"] == shipped.to_json()["entries"]
        res = check(lines, acc)
        assert res["median_abs_error"] <= 0.05 and res["max_abs_error"] <= 0.20
    else:   # a profile `sempar calibrate` measured: it reproduces its own measured points
        from sempar.calibrate.lines import line_of, to_point

        own = []
        for e in shipped.entries:
            for t, m in zip(e.tokens.tolist(), e.measured_us.tolist()):
                pt = {"op": e.op, "model": e.model, "dims": e.dims, "tokens": t,
                      "experts_per_rank": e.experts_per_rank, "phase": e.phase, "context": e.context}
                line = {**line_of(pt, m), "dims": __import__("dataclasses").asdict(e.dims)}
                own.append((line, to_point(line, "entry")))
        res = check(own, acc)
        assert res["median_abs_error"] <= 0.05 and res["max_abs_error"] <= 0.20
    held = check(lines, acc, holdout_from="h100")
    assert held["median_abs_error"] <= 0.10 and held["within_0_20"] >= 0.90


def test_interpolation_is_exact_at_points_and_monotone_between():
    d = model_dims("gpt-oss-20b")
    pts = [{"op": "moe_block", "model": d.name, "dims": d, "experts_per_rank": 4, "tokens": t,
            "measured_us": m} for t, m in ((8, 130.0), (512, 136.0), (8192, 750.0))]
    prof = build_profile("h100", {"kind": "measured"}, pts)
    acc = replace(ACCELERATORS.get("h100"), profile=prof)
    roof = Roofline(d, acc, 8, tp=False)
    us = [float(roof.router_shared_seconds(max(1, t // 4)) + roof.expert_device_seconds(t, min(4, t))) * 1e6
          for t in (8, 512, 2048, 8192)]
    assert us[0] == pytest.approx(130.0, rel=1e-6) and us[1] == pytest.approx(136.0, rel=1e-6)
    assert us[3] == pytest.approx(750.0, rel=1e-6) and us[1] < us[2] < us[3]
    # compute_scale scales every block
    slow = Roofline(d, replace(acc, compute_scale=1.3), 8, tp=False)
    assert float(slow.head_seconds(64.0)) == pytest.approx(1.3 * float(roof.head_seconds(64.0)))


def test_without_a_profile_gpus_get_the_h100_fixed_cost_floor():
    d = model_dims("qwen3-30b-a3b")
    a100 = ACCELERATORS.get("a100")
    roof = Roofline(d, a100, 8, tp=False)
    plain = roof.parts.experts(8.0, 8.0)
    floor = shipped_profile("h100").fixed_us["moe_block"] * 1e-6
    assert float(roof.expert_device_seconds(8.0, 8.0)) == pytest.approx(float(plain) + floor)
    cpu = Roofline(d, ACCELERATORS.get("cpu"), 8, tp=False)
    assert float(cpu.expert_device_seconds(8.0, 8.0)) == pytest.approx(float(cpu.parts.experts(8.0, 8.0)))


def test_profile_schema_refusals():
    from sempar.errors import InputError

    raw = shipped_profile("h100").to_json()
    for mutate, word in ((lambda r: r.update(version=2), "version"),
                         (lambda r: r.update(accelerator="tpu"), "accelerator"),
                         (lambda r: r["fixed_us"].pop("lm_head"), "fixed_us"),
                         (lambda r: r["entries"][0].update(op="conv"), "op"),
                         (lambda r: r["entries"][0].update(tokens=[8, 8, 9, 10, 11, 12]), "tokens")):
        bad = json.loads(json.dumps(raw))
        mutate(bad)
        with pytest.raises(InputError, match=word):
            profile_from_json(bad)


@pytest.mark.parametrize("args, word", [(("--reps", "nan"), "--reps"), (("--max-seconds", "0"), "--max-seconds"),
                                        (("--device", "tpu"), "--device")])
def test_calibrate_options_refused_in_one_line(tmp_path, args, word):
    r = _run("-m", "sempar", "calibrate", "--out", str(tmp_path / "p.json"), *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and word in r.stderr
    assert not (tmp_path / "p.json").exists()
