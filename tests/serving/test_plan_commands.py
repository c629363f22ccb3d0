"""The commands `sempar plan` prints run as printed (serving/deploy.py): the demo's plan on
DeepSeek-V2-Lite's real routing (the trace shipped with sempar), its `sempar` lines run in a
fresh folder and reproduce the placement the plan scored; its SGLang launch flags exist in
SGLang 0.5.23 and each changes that engine's default; and a model SGLang cannot place (OLMoE)
gets no `export --to sglang` line, by the exporter's own check."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from sempar.errors import InputError


def sglang_fields() -> dict[str, object]:
    """{--flag: default} of SGLang's server args, read from the installed 0.5.23 sources
    (`sglang/srt/arg_groups/fields/*.py`: annotated fields with literal defaults, and their
    `aliases`); the package is not imported (it needs GPU kernels)."""
    from engine_loaders import package_root

    root = package_root("sglang", "sglang") / "srt" / "arg_groups" / "fields"
    out: dict[str, object] = {}
    for f in root.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and node.value is not None):
                continue
            try:
                default = ast.literal_eval(node.value)
            except ValueError:
                continue
            names = ["--" + node.target.id.replace("_", "-")]
            for sub in ast.walk(node.annotation):
                if isinstance(sub, ast.keyword) and sub.arg == "aliases":
                    names += ast.literal_eval(sub.value)
            for n in names:
                out[n] = default
    return out


def launch_flags(line: str) -> dict[str, str]:
    words = shlex.split(line)
    assert words[:3] == ["python", "-m", "sglang.launch_server"]
    flags, i = {}, 3
    while i < len(words):
        assert words[i].startswith("--") and i + 1 < len(words), words[i:]
        flags[words[i]] = words[i + 1]
        i += 2
    return flags


@pytest.fixture(scope="module")
def demo_plan(tmp_path_factory):
    from sempar.serving.demo import DemoServeConfig, import_case, plan_case

    work = tmp_path_factory.mktemp("demo-plan")
    cfg = DemoServeConfig()
    case = cfg.cases[0]
    assert case.model == "deepseek-v2-lite"
    trace = import_case(case, work / "data" / f"{case.model}.parquet")
    small = replace(cfg, duration=1.0, n_rates=3, top=2, pipelines=("sglang-ep",),
                    policies=("round-robin",), redundant=("0", "G"))
    # vanilla and eplb: `sempar` on the whole fit split takes minutes here (the demo solves it
    # on a sample, which a printed `sempar place` does not reproduce: it says so instead)
    res = plan_case(trace, str(trace), "pcie-upi8", small, ("vanilla", "eplb"))
    return work, trace, res


@pytest.mark.slow
def test_printed_sempar_commands_run_and_reproduce_the_scored_placement(demo_plan, tmp_path):
    from sempar.comm.topology_presets import load_topology
    from sempar.export.engines import model_layout, to_sglang
    from sempar.placement import Placement
    from sempar.serving.dims import model_dims
    from sempar.serving.forecast import Forecaster
    from sempar.serving.hardware import ACCELERATORS
    from sempar.trace import read_trace

    _, trace, res = demo_plan
    tr = read_trace(trace)
    fc = Forecaster(tr, model_dims(tr.meta.model), load_topology("pcie-upi8"),
                    ACCELERATORS.get("h100"))
    placed = 0
    for r in res["ranked"]:
        lines = [c for c in r["commands"] if c.startswith("sempar ")]
        assert all(str(trace) in c for c in lines if c.startswith("sempar place"))
        folder = tmp_path / f"{r['placement']}-{r['pipeline']}-{r['policy']}"
        folder.mkdir()
        for c in lines:
            p = subprocess.run([sys.executable, "-m", "sempar.cli", *shlex.split(c)[1:]],
                               cwd=folder, capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, (c, p.stderr)
        if not lines:
            assert r["placement"] == "vanilla" and r["redundant"] == 0
            continue
        placed += 1
        got = Placement.load(folder / "placement.json")
        want = fc.placement(r["placement"], r["redundant"])
        assert np.array_equal(got.phy2log, want.phy2log), r["placement"]
        loc = json.loads((folder / "expert-location.json").read_text())
        assert loc == to_sglang(want, model_layout(want))
        assert len(loc["physical_to_logical_map"]) == 27          # V2-Lite's hidden layers
    assert placed >= 1


@pytest.mark.slow
def test_printed_engine_flags_exist_and_change_sglang_defaults(demo_plan):
    fields = sglang_fields()
    _, trace, res = demo_plan
    for r in res["ranked"]:
        launch = [c for c in r["commands"] if c.startswith("python -m sglang.launch_server")]
        assert len(launch) == 1
        flags = launch_flags(launch[0])
        assert flags.pop("--model-path") == "deepseek-ai/DeepSeek-V2-Lite"
        for flag, value in flags.items():
            assert flag in fields, flag
            assert str(fields[flag]) != value, (flag, value, "is SGLang's default")
            assert any(c.startswith(f"#   {flag} {value}: ") for c in r["commands"]), flag
        assert "--chunked-prefill-size" not in flags and "--max-running-requests" not in flags


def test_no_export_line_for_a_model_sglang_cannot_place(tmp_path):
    """Kind 12 of issue #27: an OLMoE placement is refused by `export --to sglang`; the plan's
    commands must not print that line, and say why instead."""
    from sempar.export.engines import write_engine_file
    from sempar.placement import solve
    from sempar.serving.deploy import commands
    from sempar.serving.systems import Variant
    from sempar.trace import read_trace
    from sempar.trace.synth import SynthGenerator

    path = tmp_path / "olmoe.parquet"
    SynthGenerator("olmoe-1b-7b", 4000, 40, 0).write(path)
    pl = solve("eplb", read_trace(path), num_devices=8, num_nodes=2)
    assert pl.info.get("model_type") == "olmoe"
    with pytest.raises(InputError):
        write_engine_file(pl, "sglang", tmp_path / "expert-location.json")
    out = commands(Variant("eplb", "sglang-ep"), 8, 2, str(path), "olmoe-1b-7b", pl)
    assert not any("export" in c and "--to sglang" in c for c in out if not c.startswith("#"))
    assert not any("--init-expert-location" in c for c in out if not c.startswith("#"))
    assert any(c.startswith("# no SGLang placement file") and "olmoe" in c for c in out)
    assert any(c.startswith("sempar place") and str(path) in c for c in out)


def test_demo_cases_are_the_packaged_real_traces(tmp_path, monkeypatch):
    """The demo's cases need nothing outside the package: with SEMPAR_REAL_DATA pointing nowhere
    each case's trace is the packaged one (same bytes), named by its model."""
    from sempar.paths import real_trace_path
    from sempar.serving.demo import DemoServeConfig, import_case
    from sempar.trace import read_header

    monkeypatch.setenv("SEMPAR_REAL_DATA", str(tmp_path / "nowhere"))
    cfg = DemoServeConfig()
    assert all("sempar" in c.methods for c in cfg.cases) and len(cfg.pipelines) > 1
    assert {"0", "G"} <= set(cfg.redundant) and len(cfg.policies) > 1
    for case in cfg.cases:
        out = import_case(case, tmp_path / "data" / f"{case.model}.parquet")
        assert out.read_bytes() == real_trace_path(case.model).read_bytes()
        assert read_header(out)[2].model == case.model


def _fake_plan(model: str) -> dict:
    """A plan result's shape (serving/plan.py) with made-up figures: what the report reads."""
    def dep(pl, pipe, pol, t, red=0):
        f = {"throughput_under_slo": t, "throughput_interval": [t, t * 1.02],
             "max_rate_under_slo": t / 640, "rate_interval": [t / 640, t / 627]}
        return {"placement": pl, "pipeline": pipe, "policy": pol, "redundant": red, "ep": 8,
                **f, "under_each": {"ttft": f, "e2e": f}, "commands": ["sempar place ..."]}

    base = dep("vanilla", "sglang-ep", "round-robin", 1000.0)
    ranked = [dep("sempar", "sglang-ep", "expert", 1300.0, 8),
              dep("eplb", "sglang-ep", "round-robin", 1100.0),
              dep("vanilla", "smoe-exact", "alg2", 400.0)]
    return {"model": model, "topology": "pcie-upi8", "accelerator": "h100", "eps": [8],
            "slos": {"ttft": 0.1, "e2e": 1.5}, "slo_keys": ["ttft", "e2e"], "noise": 0.02,
            "search": {"tolerance": 0.02}, "choice": {"text": ""}, "baseline": base,
            "ranked": ranked,
            "screened": [{k: r[k] for k in ("pipeline", "placement", "policy", "redundant")}
                         for r in ranked],
            "skipped": [{"reason": "vanilla/sglang-ep/expert: expert's token table needs token ids"}],
            "attribution": [{"part": "placement: balance (eplb)", "gain": 1.1},
                            {"part": "placement: locality (sempar)", "gain": 1.1},
                            {"part": "request policy", "gain": 1.07}]}


def test_answer_first_screen(tmp_path):
    """The report's first screen: the answer per case naming pipeline, placement and policy,
    the gain made of balance and locality apart, what was compared and skipped, the gain chart,
    then "how sure"; the evidence after it."""
    from sempar.report.html import HtmlReport
    from sempar.serving.plots import plot_gains
    from html import escape

    from sempar.serving.report import answer_line, answer_section

    results = [_fake_plan("deepseek-v2-lite"), _fake_plan("gpt-oss-20b")]
    png = plot_gains(results, tmp_path / "gains.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    rep = HtmlReport("t")
    answer_section(rep, results, png)
    html = rep.render()
    assert html.index("Answer: what to deploy") < html.index("data:image/png") < html.index("How sure")
    # one line per case first (deploy what, gain, interval), then the chart, then the details
    lines = [answer_line(r) for r in results]
    assert "deploy sempar placement on sglang-ep, expert, 8 redundant slots: 1.30x [1.27, 1.33]" \
        in lines[0]
    assert "a100x4-ib" not in lines[0] and "EP 8 on pcie-upi8 (one server" in lines[0]
    assert all(html.index(escape(x)) < html.index("data:image/png") for x in lines)
    assert html.index("data:image/png") < html.index("Made of: placement: balance")
    assert "deploy sglang-ep with the sempar placement, request policy expert, 8 redundant" in html
    assert "1.30x [1.27, 1.33]" in html
    assert "placement: balance (eplb) 1.10x, placement: locality (sempar) 1.10x" in html
    assert "pipelines sglang-ep, smoe-exact" in html and "1 skipped (" in html
    assert "Attention-DP policies expert, round-robin;" in html    # not smoe-exact's alg2
