"""The `sempar bench --json` object: figures of one run, their summary per method, the saved last
result and its table rows (the console table, `sempar demo`).

Times per run (`runtime.modes.CLOCKS`, per layer on each rank, min over the run's repeats):
`moe_block_seconds` the MoE block (router, dispatch, experts, combine), `attn_comm_seconds` the
attention-side collectives (TP AR / RS / AG, exflow's context all-gather, tp-exact's logit
all-reduce), `layer_seconds` the whole decoder layer; each the mean over layers of the max over
ranks, and per rank (`rank_seconds`: {bucket: float[G]}, mean over layers). Per method: median
over batches (times, element-wise per rank), sums (bytes), mean (LAR), max (logit error).
`moe_layer_seconds` (the contract's name) = `layer_seconds`. Ratios to the baseline:
`time_ratio` (forward), `moe_block_ratio` (MoE block; the table's "x vanilla").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

TIMES = {"layer": "layer_seconds", "moe_block": "moe_block_seconds",
         "attn_comm": "attn_comm_seconds"}
SUMS = ("bytes_sent", "bytes_total", "bytes_predicted", "dispatch_sent", "dispatch_predicted",
        "prerouting_sent", "prerouting_predicted")
TABLE_HEADER = ["method", "mode", "MoE block ms", "attn comm ms", "layer ms", "forward ms",
                "x vanilla (block)", "sent MB (d+c)", "predicted MB", "all MB", "LAR",
                "max |dlogit|"]


def result_path() -> Path:
    """Where the last result is written: $SEMPAR_BENCH_RESULT or ~/.cache/sempar/bench-last.json."""
    env = os.environ.get("SEMPAR_BENCH_RESULT")
    return Path(env) if env else Path.home() / ".cache" / "sempar" / "bench-last.json"


def last_bench_result() -> dict | None:
    """The last `sempar bench` result (the --json object), or None when there is none / unreadable."""
    try:
        from sempar.safe_json import parse_json

        return parse_json(result_path().read_bytes(), str(result_path()))
    except (OSError, ValueError):
        return None


def run_figures(run, ref_logits: torch.Tensor, num_layers: int,
                prediction: tuple[float, float, float, float]) -> dict:
    """One run's figures: `run` a runtime RunResult, ref_logits float32[B, S, V] the
    single-process forward's, prediction the simulator's (dispatch, combine, LAR, pre-routing)."""
    pd, pc, lar, pp = prediction
    dc = run.dispatch_combine(num_layers)
    out = {TIMES[b]: float(np.mean(run.seconds(b))) for b in TIMES}
    out["rank_seconds"] = {b: run.rank_seconds[b].mean(axis=1).tolist() for b in TIMES}
    out.update({
        "forward_seconds": float(run.forward_seconds),
        "dispatch_sent": int(dc[:, 0].sum()), "dispatch_predicted": pd,
        "bytes_sent": int(dc.sum()), "bytes_total": run.total(), "bytes_predicted": pd + pc,
        "lar_mean": lar, "prerouting_sent": run.total("prerouting"), "prerouting_predicted": pp,
        "max_abs_logit_diff": float((run.logits - ref_logits).abs().max()),
        "logits_allclose": bool(torch.allclose(run.logits, ref_logits, rtol=1e-5, atol=1e-5))})
    return out


def summarise(rows: list[dict], method, baseline: dict | None = None) -> dict:
    """A method's entry of `methods` from its runs' figures (one per batch); `method` a
    bench.plan.Method; baseline the baseline method's entry (None: this is the baseline)."""
    col = lambda k: [x[k] for x in rows]  # noqa: E731
    out = {TIMES[b]: float(np.median(col(TIMES[b]))) for b in TIMES}
    out["moe_layer_seconds"] = out["layer_seconds"]
    out["rank_seconds"] = {b: np.median([x["rank_seconds"][b] for x in rows], axis=0).tolist()
                           for b in TIMES}
    out["forward_seconds"] = float(np.median(col("forward_seconds")))
    out.update({k: (int if k.endswith("sent") or k == "bytes_total" else float)(sum(col(k)))
                for k in SUMS})
    out.update({"lar_mean": float(np.mean(col("lar_mean"))),
                "max_abs_logit_diff": float(max(col("max_abs_logit_diff"))),
                "logits_allclose_1e-5": all(col("logits_allclose")),
                "placement": method.placement, "mode": method.mode,
                "scheduling": method.scheduling, "pipeline": method.pipeline,
                "forward_seconds_per_batch": col("forward_seconds")})
    base = baseline or out
    out["time_ratio"] = _ratio(out["forward_seconds"], base["forward_seconds"])
    out["moe_block_ratio"] = _ratio(out["moe_block_seconds"], base["moe_block_seconds"])
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def bench_table_rows(result: dict) -> list[list[str]]:
    """Rows of `TABLE_HEADER` for a result, formatted: times in ms, the MoE block's ratio to the
    baseline, MB. Results saved before the MoE block was timed show "" in its columns."""
    rows = []
    for name, m in result.get("methods", {}).items():
        ms = lambda k: "" if m.get(k) is None else f"{m[k] * 1e3:.1f}"  # noqa: E731
        ratio = m.get("moe_block_ratio")
        rows.append([name, m.get("mode", ""), ms("moe_block_seconds"), ms("attn_comm_seconds"),
                     ms("moe_layer_seconds"), ms("forward_seconds"),
                     "" if ratio is None else f"{ratio:.2f}",
                     _mb(m["bytes_sent"]), _mb(m["bytes_predicted"]),
                     _mb(m.get("bytes_total", float("nan"))), f"{m['lar_mean']:.3f}",
                     f"{m['max_abs_logit_diff']:.1e}"])
    return rows


def _mb(b: float) -> str:
    return f"{b / 1e6:.3f}"
