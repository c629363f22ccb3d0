"""End-to-end: the `sempar` verbs of issue 2 as a user runs them (real subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sempar.atomic import MARKER

from sempar.paths import olmoe_aggregates_dir


def sempar(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sempar.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=1500)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    p = d / "t.parquet"
    r = sempar("synth", "--preset", "olmoe-1b-7b", "--tokens", "20000", "--requests", "80",
               "--seed", "1", "--out", str(p), cwd=d)
    assert r.returncode == 0, r.stderr
    return p


def test_synth_then_info(trace_file):
    r = sempar("trace", "info", str(trace_file), "--json", cwd=trace_file.parent)
    assert r.returncode == 0
    info = json.loads(r.stdout)
    assert (info["tokens"], info["requests"], info["layers"], info["experts"], info["top_k"]) == \
        (20000, 80, 16, 64, 8)
    assert info["model"] == "synthetic:olmoe-1b-7b"
    assert sum(info["domains"].values()) == 20000
    assert sempar("trace", "validate", str(trace_file), cwd=trace_file.parent).returncode == 0


def test_analyze_json_contract_and_outputs(trace_file, tmp_path):
    out = tmp_path / "analysis"
    r = sempar("analyze", str(trace_file), "--out", str(out), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)  # stdout holds exactly one JSON object
    assert len(result["layers"]) == 16
    layer = result["layers"][0]
    assert set(layer) >= {"layer", "f1", "cum_hotness_topk", "max_hotness_non_topk", "kurtosis_p50"}
    assert set(layer["f1"]) == {"p25", "p50", "p75"}
    s = result["summary"]
    assert set(s) >= {"f1_p50_mean", "cum_hotness_topk_p50_mean",
                      "max_hotness_non_topk_p50_mean", "lookback_accuracy"}
    assert len(s["lookback_accuracy"]) == 5
    assert 0.83 <= s["cum_hotness_topk_p50_mean"] <= 0.98
    for name in ("analysis.json", "report.html", "table1.png", "lookback.png", "transitions.png",
                 "requests.png", "load_tail.png", "kurtosis.png"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "analysis.json").read_text())["summary"] == s
    assert not [f for f in out.iterdir() if f.name.startswith(".") and f.name != MARKER]


def test_analyze_bad_trace_leaves_nothing(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file")
    out = tmp_path / "never"
    r = sempar("analyze", str(bad), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "bad.parquet" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("args, needle", [
    (["analyze"], "TRACE"),
    (["synth", "--preset", "nope", "--tokens", "10", "--out", "x.parquet"], "unknown preset"),
    (["synth", "--preset", "mixtral-8x7b", "--tokens", "-5", "--out", "x.parquet"], "--tokens"),
    (["analyze", "missing.parquet"], "no such file"),
])
def test_bad_input_one_line_exit_2(tmp_path, args, needle):
    r = sempar(*args, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]
    assert not (tmp_path / "x.parquet").exists()
    assert r.stdout == ""


@pytest.mark.skipif(olmoe_aggregates_dir() is None, reason="shared/data/real is absent")
def test_analyze_real_aggregates_json(tmp_path):
    r = sempar("analyze", "--olmoe-aggregates", str(olmoe_aggregates_dir()), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    models = json.loads(r.stdout)["models"]
    assert models["olmoe"]["num_experts"] == 64 and models["mixtral"]["num_experts"] == 8
    assert [l["layer"] for l in models["olmoe"]["layers"]] == [0, 7, 15]


@pytest.mark.slow          # 4-5 minutes: the whole demo (solvers, serving forecast, report)
def test_demo_writes_report_and_summary(demo_out, demo_stdout):
    out = demo_out
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["stages"])[:2] == ["trace", "analyze"]
    traces = summary["stages"]["trace"]
    assert traces and all(t["info"]["tokens"] > 10_000 for t in traces.values())
    for name in traces:
        result = summary["stages"]["analyze"][name]
        assert result["summary"]["lookback_accuracy"][4] > 0.3
        # a trained (or calibrated) router beats a random one of the same shape
        assert result["summary"]["f1_mean"] > result["control"]["summary"]["f1_mean"] + 0.2
    html = (out / "report.html").read_text()
    assert "Sem-MoE Table 1" in html and html.count("data:image/png;base64") >= 6
    if olmoe_aggregates_dir() is not None:
        assert summary["stages"]["real-aggregates"]["models"]["olmoe"]["layers"]
        assert "Real routing" in html
    check_demo_answer(out, summary, html)
    # the terminal gets the answer, one line per case, and where the report is
    assert demo_stdout.count("SGLang's launch under") == len(summary["stages"]["serve"]["cases"])
    assert f"wrote {out / 'report.html'}" in demo_stdout


def check_demo_answer(out, summary: dict, html: str) -> None:
    """The report opens with the serving answer on the packaged real-model routing: per case a searched figure with its interval, a ratio to
    SGLang's launch, and commands naming the trace the demo wrote."""
    first = html[html.index("<h2>"):]
    assert first.startswith("<h2>Answer: what to deploy")
    serve = summary["stages"]["serve"]
    cases = {(c["model"], c["topology"]) for c in serve["cases"]}
    assert {"deepseek-v2-lite", "gpt-oss-20b"} == {m for m, _ in cases} and len(cases) == 4
    for c in serve["cases"]:
        win, base = c["ranked"][0], c["baseline"]
        lo, hi = win["rate_interval"]
        assert lo == win["max_rate_under_slo"] and hi is not None and hi - lo <= 0.021 * lo
        assert win["throughput_under_slo"] > 0 and base["throughput_under_slo"] > 0
        place = [x for x in win["commands"] if x.startswith("sempar place")]
        assert all(str(out / "data") in x for x in place)
        assert all((out / "data" / f"{c['model']}.parquet").is_file() for _ in place)
    assert "x SGLang" in html and "How sure" in html


def test_old_spellings_still_read(tmp_path, capsys):
    """`--ep` is the device count on every verb; `analyze --devices` still reads the same."""
    from conftest import build_trace
    from sempar.cli import main
    from sempar.trace import write_trace

    p = tmp_path / "t.parquet"
    write_trace(build_trace(T=400, R=20, L=3, N=16, k=2), p)

    def run(*args: str) -> dict:
        with pytest.raises(SystemExit) as e:
            main(["analyze", str(p), "--json", *args])
        assert e.value.code == 0
        return json.loads(capsys.readouterr().out)

    new, old = run("--ep", "4"), run("--devices", "4")
    assert new == old
    assert new != run("--ep", "2")     # the option is read, not ignored


def test_library_warning_is_one_note(tmp_path):
    """A trace of one repeated token leaves k-means fewer distinct points than devices: scikit-
    learn's ConvergenceWarning (kmeans2d and semmoe, every layer) is one `note:` line, not raw."""
    import dataclasses

    import numpy as np

    from conftest import build_trace
    from sempar.trace import write_trace

    t = build_trace(T=400, R=20, L=3, N=16, k=2)
    p = tmp_path / "same.parquet"
    write_trace(dataclasses.replace(t, token_id=np.zeros_like(t.token_id)), p)
    r = sempar("evaluate", "--fit", str(p), "--split", "--ep", "4", "--methods", "kmeans2d,semmoe",
               "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert set(json.loads(r.stdout)["methods"]) == {"kmeans2d", "semmoe"}
    assert "Warning" not in r.stderr and "warn" not in r.stderr, r.stderr[-2000:]
    notes = [line for line in r.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "distinct clusters" in notes[0], r.stderr[-2000:]
