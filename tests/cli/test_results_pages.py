"""scripts/make_results.py: a small bench_placement --json report becomes docs/results/placement.md
with the benchmark formatter's table and a stamp; bad input is one line, exit 2, no page."""

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "make_results", Path(__file__).parents[2] / "scripts" / "make_results.py")
make_results = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(make_results)


def _method(lar: float, imb: float, share: float) -> dict:
    return {"lar_mean": lar, "lar_p50": lar, "oracle_lar_mean": lar / share,
            "oracle_lar_unconstrained_mean": 0.6, "node_local_rate": 1.0,
            "remote_copies_per_token": 1.0, "imbalance_max_mean": imb,
            "imbalance_max_median": imb, "share_of_oracle": share, "solve_seconds": 0.1}


REPORT = [
    {"trace": "tiny-moe64", "shape": "4", "ep": 4, "nodes": 1, "mode": "tp", "redundant": 0,
     "methods": {"vanilla": _method(0.25, 1.41, 0.65), "sempar": _method(0.412, 1.06, 0.90)},
     "refs": {"ref: capacity-bound oracle": {"lar_mean": 0.458, "placement": "sempar"}},
     "verdict": ["target 'x': MET (lead +0.040)"]},
    {"trace": "synthetic olmoe-1b-7b", "shape": "2x4", "ep": 8, "nodes": 2, "mode": "tp",
     "redundant": 0,
     "methods": {"vanilla": _method(0.125, 1.54, 0.44), "sempar": _method(0.228, 1.08, 0.69)},
     "refs": {}, "verdict": []},
]

EXPECTED_TABLE = """\
tp mode: LAR (imbalance max/mean) share of its capacity-bound oracle

| method | tiny-moe64 4 | olmoe-1b-7b 2x4 |
| --- | --- | --- |
| sempar | 0.412 (1.06) 90% | 0.228 (1.08) 69% |
| vanilla | 0.250 (1.41*) 65% | 0.125 (1.54*) 44% |
| ceiling | 0.458 (sempar) |  |
"""


def _run(capsys, *args: str):
    """(exit code, stderr) of the script's main on `args`."""
    capsys.readouterr()
    code = make_results.main(list(args))
    return code, capsys.readouterr().err


def test_placement_page_has_the_table_and_stamp(tmp_path, capsys):
    bench = tmp_path / "bp.json"
    # a solver's own print before the JSON line is skipped, as bench_placement_table does
    bench.write_text("Running HiGHS\n" + json.dumps(REPORT) + "\n")
    out = tmp_path / "results"
    code, err = _run(capsys, str(bench), "--out", str(out), "--command",
                     "bench_placement.py --json", "--note", "short run")
    assert code == 0, err
    text = (out / "placement.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["placement.md"]
    assert EXPECTED_TABLE in text
    assert "- tiny-moe64 4, tp mode, R 0: target 'x': MET (lead +0.040)" in text
    for row in ("| commit | `", "| benchmark output written | ", "| page generated | ",
                "| machine | ", "| load average at generation (1 / 5 / 15 min) | ",
                "| command | `bench_placement.py --json` |", "| scope | short run |"):
        assert row in text
    assert "do not edit by hand" in text


@pytest.mark.parametrize("content, says", [
    ("not json at all\n", "no JSON line"),
    ("[1, 2\n", "not JSON"),
    ('{"a": 1}\n', "not the --json output of a benchmark"),
])
def test_bad_input_is_one_line_exit_2_and_no_page(tmp_path, capsys, content, says):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(REPORT))
    bad.write_text(content)
    out = tmp_path / "results"
    code, err = _run(capsys, str(good), str(bad), "--out", str(out))
    assert code == 2
    assert err.count("\n") == 1 and says in err and str(bad) in err
    assert not out.exists()


def test_missing_input_is_refused(tmp_path, capsys):
    code, err = _run(capsys, str(tmp_path / "absent.json"), "--out", str(tmp_path / "results"))
    assert code == 2 and err.count("\n") == 1 and "cannot read" in err
    assert not (tmp_path / "results").exists()


def _exact(own: float, exact: float, imb: float) -> dict:
    return dict(_method(own, imb, own / exact), oracle_imbalance_max_mean=imb)


REAL = [
    {"trace": "deepseek-v2-lite-esft", "shape": "4", "ep": 4, "nodes": 1, "mode": "tp",
     "redundant": 0, "homes": "exact", "real": True,
     "methods": {"eplb": _exact(0.25, 0.44, 1.05), "sempar": _exact(0.25, 0.60, 1.08)},
     "refs": {"ref: capacity-bound oracle": {"lar_mean": 0.60, "placement": "sempar"},
              "ref: every token on its best device": {"lar_mean": 0.625, "placement": "sempar"}},
     "verdict": ["target 'y': MET"]},
    {"trace": "deepseek-v2-lite-esft", "shape": "4", "ep": 4, "nodes": 1, "mode": "tp",
     "redundant": 0, "homes": "exact", "real": True,
     "cross": {"folds": [{"eval_domains": ["law"], "fit_domains": ["intent", "summary"]}]},
     "methods": {"sempar": {"in_lar": 0.634, "cross_lar": 0.567, "retained": 0.894,
                            "in_imbalance": 1.07, "cross_imbalance": 1.277}},
     "verdict": ["target 'z': MISSED"]},
]


def test_dp_cells_share_the_dp_ceiling_and_held_out_table(tmp_path, capsys):
    """dp's ceiling is named "requests on best rank, balanced": the cells' share uses it (the
    page once printed `nan%`); sempar's held-out prediction gets its own table."""
    held = {"predicted_imbalance": 1.081, "predicted_upper": 1.093, "fit_cap": 1.03,
            "within_budget": True}
    case = dict(REAL[0], mode="dp", methods={
        "eplb": _exact(0.20, 0.25, 1.05),
        "sempar": dict(_exact(0.25, 0.28, 1.09), held_out=held)},
        refs={"ref: requests on best rank, balanced": {"lar_mean": 0.28, "placement": "sempar"},
              "ref: every token on its best device": {"lar_mean": 0.6, "placement": "sempar"}})
    bench = tmp_path / "real.json"
    bench.write_text(json.dumps([case]) + "\n")
    code, err = _run(capsys, str(bench), "--out", str(tmp_path))
    assert code == 0, err
    text = (tmp_path / "placement-real.md").read_text()
    assert "nan" not in text
    assert "| sempar | 0.280 (1.09) 100% |" in text and "| eplb | 0.250 (1.05) 89% |" in text
    assert ("| deepseek-v2-lite-esft 4 | dp | 0 | 1.030 | 1.081 (1.093) | 1.090 | -0.009 | yes | "
            "0.280 | eplb 0.250 (1.050) | +0.030 |") in text


def test_real_cases_get_their_page_with_exact_and_cross_tables(tmp_path, capsys):
    bench = tmp_path / "real.json"
    bench.write_text(json.dumps(REAL) + "\n")
    out = tmp_path / "results"
    code, err = _run(capsys, str(bench), "--out", str(out))
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["placement-real.md"]
    text = (out / "placement-real.md").read_text()
    assert "tp mode, exact homes (each placement's capacity-bound oracle)" in text
    assert "| sempar | 0.600 (1.08) 100% |" in text and "| eplb | 0.440 (1.05) 73% |" in text
    assert "| ceiling | 0.600 (sempar) |" in text and "| best device | 0.625 (sempar) |" in text
    assert "| sempar | 0.634 / 0.567 (0.89), 1.28 |" in text
    assert "| folds (eval <- fit) | law <- intent+summary |" in text
    assert "- deepseek-v2-lite-esft 4, tp mode, R 0, exact homes: target 'y': MET" in text
    assert "- deepseek-v2-lite-esft 4, tp mode, cross-domain, exact homes: target 'z': MISSED" in text
    # with a dev case beside, the file is the ordinary placement page with both kinds of table
    bench.write_text(json.dumps(REAL + REPORT) + "\n")
    code, err = _run(capsys, str(bench), "--out", str(out))
    assert code == 0, err
    text = (out / "placement.md").read_text()
    assert EXPECTED_TABLE in text and "| sempar | 0.600 (1.08) 100% |" in text


def test_demo_page_has_the_printed_answer_and_stage_times(tmp_path, capsys):
    """The demo's summary.json (indented) becomes docs/results/demo.md: the answer lines the
    demo prints and each stage's wall and CPU seconds, under the one stamp."""
    case = {"model": "gpt-oss-20b", "topology": "a100x4-ib", "accelerator": "h100", "eps": [8],
            "slo_keys": ["ttft", "e2e"],
            "baseline": {"throughput_under_slo": 1000.0, "throughput_interval": [990.0, 1010.0]},
            "ranked": [{"placement": "sempar", "pipeline": "sglang-ep", "policy": "round-robin",
                        "redundant": 0, "ep": 8, "throughput_under_slo": 1300.0,
                        "throughput_interval": [1300.0, 1320.0]}]}
    summary = {"stages": {"serve": {"cases": [case]}}, "seconds": {"trace": 1.0, "serve": 99.0},
               "cpu_seconds": {"trace": 0.5, "serve": 90.0}}
    src = tmp_path / "summary.json"
    src.write_text(json.dumps(summary, indent=1))
    out = tmp_path / "results"
    code, err = _run(capsys, str(src), "--out", str(out), "--note", "demo run")
    assert code == 0, err
    text = (out / "demo.md").read_text()
    assert "| stamp | |" in text and "| scope | demo run |" in text
    assert ("- gpt-oss-20b, EP 8 on a100x4-ib (2 nodes x 4 GPUs, NVLink inside, InfiniBand "
            "between), H100 compute: deploy sempar placement on sglang-ep, round-robin, no "
            "redundant slots: 1.30x [1.29, 1.33] SGLang's launch under TTFT + E2E") in text
    assert "| serve | 99.0 | 90.0 |" in text and "| total | 100.0 | 90.5 |" in text


def test_optimality_page_has_the_certified_ratio(tmp_path, capsys):
    rows = [{"trace": "gpt", "ep": 8, "path": p, "in_sample": lar, "bound": 0.4572,
             "gap": lar / 0.4572, "best_known": 0.4212, "max_imbalance": 1.0858,
             "bound_any_balance": 0.4817, "cpu_s": 16.8,
             "bound_method": "device configuration LP (capacity-bound, HiGHS)"}
            for p, lar in (("new", 0.4095), ("hypergraph", 0.4109))]
    rows[1].update(in_sample_optimal=0.4200, gap_optimal=0.4200 / 0.4572)
    bench = tmp_path / "ob.json"
    bench.write_text(json.dumps(rows) + "\n")
    out = tmp_path / "results"
    code, err = _run(capsys, str(bench), "--out", str(out))
    assert code == 0, err
    text = (out / "optimality-bound.md").read_text()
    # the default (optimal) homes' figure and ratio first, then the greedy homes' (issue 46)
    assert "| GPT-OSS-20B EP 8 | sempar-hypergraph | 0.4200 | 0.9186 | 0.4109 | 0.899 | 0.4212 " \
           "| 0.4572 (device configuration LP) | 1.086 |" in text
    assert "| in-sample LAR | certified ratio | in-sample LAR, greedy homes |" in text
    assert "| sempar |  |  | 0.4095 | 0.896 | 0.4212 | 0.4572 (device configuration LP) | " \
           "1.086 |" in text          # a row from before the optimal homes: blank there


def test_stats_page_from_bench_stats_json(tmp_path, capsys):
    """benchmarks/bench_stats.py's results file becomes docs/results/stats.md: the pipeline's
    steps, its totals against the target, the token tables' cap and error, the side by side."""
    step = {"seconds": 12.5, "cpu_seconds": 20.1, "peak_tree_rss_gb": 1.5,
            "peak_process_rss_gb": 1.0, "load_before": 1.0, "load_after": 1.2, "rc": 0}
    # a run that recorded its own process's and largest worker's peaks beside one that did not
    split = {**step, "peak_main_rss_gb": 0.7, "peak_child_rss_gb": 0.4}
    doc = {"runs": [{"tokens": 1000, "shards": 2, "ep": 64, "jobs": 2, "cpus": 2,
                     "when": "2026-12-07 09:00 UTC", "whole_trace_ids_gb": 0.0,
                     "build": step, "solve_stats": split, "stats_file_gb": 0.1,
                     "build_plus_solve_s": 25.0, "build_plus_solve_cpu_s": 40.2,
                     "pipeline_peak_rss_gb": 1.5,
                     "stats_info": {"rows": 1000, "token_cells": 2097152,
                                    "token_table_cells": 5000, "token_error_max": 0}}],
           "side_by_side": {"tokens": 240000, "cpus": 2, "when": "2026-12-07 09:10 UTC",
                            "build": step, "trace_ep16": step, "stats_ep16": step,
                            "same_ep16": True}}
    bench = tmp_path / "stats.json"
    bench.write_text(json.dumps(doc, indent=1) + "\n")
    code, err = _run(capsys, str(bench), "--out", str(tmp_path))
    assert code == 0, err
    text = (tmp_path / "stats.md").read_text()
    assert "| place --stats | 12.5 | 20.1 | 1.5 | 1.0 | 0.7 / 0.4 | 1.0 / 1.2 | 0 |" in text
    assert "| place --trace, EP 16 | 12.5 | 20.1 | 1.5 | 1.0 |  | 1.0 / 1.2 | 0 |" in text
    assert "**25.0 s wall, 40.2 CPU s, peak 1.5 GB across processes**" in text
    assert "cap 2,097,152 a layer" in text and "| place --trace, EP 16 | 12.5 |" in text
