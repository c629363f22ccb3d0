"""`sempar stream` as a user runs it: the design.md JSON contract, plots, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sempar.atomic import MARKER

TRACE = Path(__file__).resolve().parents[2] / "src/sempar/assets/traces/tiny-moe64.parquet"


def sempar(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sempar.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_stream_json_contract_and_plots(tmp_path):
    plots = tmp_path / "figs"
    r = sempar("stream", "--model", "qwen3-30b-a3b", "--trace", str(TRACE), "--tokens-per-iter", "16",
               "--iterations", "4", "--strategy", "all", "--json", "--plot", str(plots), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"] == "qwen3-30b-a3b" and out["tokens_per_iter"] == 16
    names = ["ep", "ep-db", "hydra", "hydra-db", "fsedp-naive", "fsedp", "fsedp+paired-load", "fsedp+paired-load+rule5",
             "fsedp+paired-load+buffering10", "fsedp+paired-load+buffering20", "fsedp+paired-load+buffering30"]
    assert list(out["strategies"]) == names
    for s in out["strategies"].values():
        for k in ("layer_latency_s", "e2e_latency_s", "utilization", "peak_onchip_bytes"):
            assert s[k] > 0
        assert 0 < s["utilization"] <= 1
        assert len(s["layer_latency_by_layer_s"]) == 48
        tl = s["utilization_timeline"]
        assert len(tl["t_s"]) == 50 and max(tl["utilization"]) <= 1 + 1e-9
    assert out["strategies"]["ep"]["speedup_vs_ep"] == pytest.approx(1.0)
    got = sorted(p.name for p in plots.iterdir())
    assert {"fig11_utilization_timeline.png", "fig12_peak_memory.png", "fig13_activity.png",
            "fig14_e2e.png"} <= set(got)
    assert MARKER in got        # the folder is a sempar output (swapped in whole) ...
    assert not [p for p in got if p.startswith(".") and p != MARKER]    # ... with no temporary


@pytest.mark.parametrize("args,needle", [
    (["--mesh", "5x5"], "--mesh"),
    (["--strategy", "nope"], "unknown strategy"),
    (["--model", "gpt"], "unknown model"),
    (["--model", "phi-3.5-moe", "--buffer-mb", "1", "--micro-slices", "4"], "buffer"),
    (["--trace", "missing.parquet"], "--trace"),
    (["--tokens-per-iter", "0"], "--tokens-per-iter"),
])
def test_stream_bad_input_one_line_exit_2(tmp_path, args, needle):
    plots = tmp_path / "figs"
    r = sempar("stream", "--iterations", "2", "--plot", str(plots), *args, cwd=tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr
    assert r.stdout == "" and not plots.exists()
