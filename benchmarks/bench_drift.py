"""Re-placement under drift: static, resolve, eplb-periodic and sempar-incremental side by side on
drift streams built from the shipped real traces (issue 38), with the issue's verdicts.

    python benchmarks/bench_drift.py --json drift.json [--table docs/results/drift.md]
    python benchmarks/bench_drift.py --from drift.json --table docs/results/drift.md

Streams (`sempar.drift.streams`), each replayed at EP 4 (`sempar.drift.replay`):
- `esft-tasks`: DeepSeek-V2-Lite ESFT prefill, intent -> law -> summary (173 requests);
- `esft-mixture`: the same requests in segments of 16, each 80 % one task (switching);
- `mmlu-groups`: GPT-OSS-20B MMLU decode, the four subject groups one after another (524
  requests).
Steps of 16 requests with a window of 16 on ESFT (10 steps), 64 with a window of 32 on MMLU (8
steps): the `resolve` policy's full sempar solve per step
is the cost on 2 loaded cores, so few, large steps; `sempar-incremental` keeps 3 windows of
load history (`--history`, `sempar.drift.history`); every request of each trace after the
warm-up window is served (no subsample).
Targets (issue 38), on each stream where `static` drifts above imbalance p95 1.15:
sempar-incremental LAR >= 0.95 x resolve's, imbalance p95 <= 1.10, migrated bytes <= 20 % of
resolve's; against eplb-periodic (same period) higher LAR and lower imbalance p95 at no more
migrated bytes; against static imbalance p95 <= 1.10 with LAR no lower.
The table is generated from the JSON (`--table`), stamped with commit, date, machine and load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ["static", "resolve", "eplb-periodic", "sempar-incremental"]
# name: (asset, order, switch_every, every, window)
STREAMS = {
    "esft-tasks": ("deepseek-v2-lite-esft", "tasks", 16, 16, 16),
    "esft-mixture": ("deepseek-v2-lite-esft", "mixture", 16, 16, 16),
    "mmlu-groups": ("gpt-oss-20b-mmlu", "groups", 32, 64, 32),
}


def run_stream(name: str, ep: int, max_moves: int, max_imbalance: float, history: int = 3) -> dict:
    from sempar.drift.config import ReplayConfig
    from sempar.drift.history import History
    from sempar.drift.replay import replay
    from sempar.drift.streams import drift_stream
    from sempar.paths import assets_dir
    from sempar.solve_options import SolveOptions
    from sempar.trace import read_trace

    asset, order, k, every, window = STREAMS[name]
    trace = read_trace(assets_dir() / "traces" / f"{asset}.parquet", optional=("domain",))
    stream = drift_stream(trace, order, switch_every=k, mix=0.8, seed=0)
    cfg = ReplayConfig.for_model(trace.meta.model, ep,
                                 solve=SolveOptions(jobs=1, max_imbalance=max_imbalance),
                                 rebalance=dict(max_moves=max_moves), every=every, window=window,
                                 history=History(windows=history))
    t0 = time.perf_counter()
    out = replay(stream, POLICIES, cfg)
    out.update({"stream": name, "asset": asset, "order": order, "switch_every": k,
                "model": trace.meta.model, "wall_s": time.perf_counter() - t0})
    settle(out)
    return out


def settle(r: dict) -> None:
    """Add the settled imbalance p95 (steps after an unseen switch left out) and the verdicts."""
    unseen = unseen_steps(r)
    r["unseen_steps"] = unseen
    for p in r["policies"].values():
        p["imbalance_p95_settled"] = settled_p95(p, unseen)
    r["verdicts"] = verdicts(r["policies"])


def unseen_steps(r: dict) -> list[bool]:
    """Per step: whether the step's majority domain held under half of the update window it was
    placed from (the first step after a switch to new traffic, which no reactive policy sees
    coming). Rebuilt from the stream, which is deterministic (order, K, mix, seed 0)."""
    import numpy as np

    from sempar.drift.streams import drift_stream, request_table
    from sempar.paths import assets_dir
    from sempar.trace import read_trace

    trace = read_trace(assets_dir() / "traces" / f"{r['asset']}.parquet", optional=("domain",))
    _, dom, _, _ = request_table(drift_stream(trace, r["order"], switch_every=r["switch_every"],
                                              mix=0.8, seed=0))
    out = []
    for st in next(iter(r["policies"].values()))["steps"]:
        a, b = st["first_request"], st["first_request"] + st["requests"]
        main = np.bincount(dom[a:b]).argmax()
        win = dom[max(0, a - r["window"]):a]
        out.append(bool((win == main).mean() < 0.5))
    return out


def settled_p95(p: dict, unseen: list[bool]) -> float:
    """imbalance p95 over the steps that are not `unseen` (NaN when none is left)."""
    import numpy as np

    keep = [s["imbalance"] for s, u in zip(p["steps"], unseen) if not u]
    return float(np.percentile(keep, 95)) if keep else float("nan")


def verdicts(p: dict) -> dict:
    """The issue's targets as booleans (None where static does not drift above 1.15)."""
    s, r, e, i = (p[n] for n in POLICIES)
    drifts = s["imbalance_p95"] > 1.15
    v = {"static_drifts": drifts,
         "lar_vs_resolve": i["lar_mean"] / max(r["lar_mean"], 1e-12),
         "bytes_vs_resolve": i["migrated_bytes"] / max(r["migrated_bytes"], 1e-12)}
    v.update({
        "inc_lar_ge_0.95_resolve": v["lar_vs_resolve"] >= 0.95,
        "inc_imbalance_p95_le_1.10": i["imbalance_p95"] <= 1.10,
        "inc_bytes_le_0.2_resolve": v["bytes_vs_resolve"] <= 0.20,
        "vs_eplb_lar_higher": i["lar_mean"] > e["lar_mean"],
        "vs_eplb_imbalance_lower": i["imbalance_p95"] < e["imbalance_p95"],
        "vs_eplb_bytes_no_more": i["migrated_bytes"] <= e["migrated_bytes"],
        "vs_static_lar_no_lower": i["lar_mean"] >= s["lar_mean"],
        "inc_settled_p95_le_1.10": i["imbalance_p95_settled"] <= 1.10,
        "vs_eplb_settled_p95_lower": i["imbalance_p95_settled"] < e["imbalance_p95_settled"],
        "static_settled_p95": s["imbalance_p95_settled"],
    })
    return v


def stamp() -> str:
    """docs/results' one stamp (results_stamp.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results_stamp import stamp as results_stamp

    return results_stamp("benchmarks/bench_drift.py", "benchmarks/bench_drift.py --json",
                         note="a shared, loaded machine: the update times are not figures of "
                              "the method")


def table(results: list[dict]) -> str:
    lines = ["# Re-placement under drift (generated)", "", stamp(), "",
             "Each stream: the policies side by side (`sempar replay`, EP 4); LAR = mean exact-"
             "home LAR over the steps, imbalance = p95 over steps of the mean-over-layers max/mean"
             " device load; settled = the same without the steps right after a switch to traffic "
             "the update window had not seen (no reactive policy can see it coming); layer p95 = "
             "over every step and layer; migrated = expert weights copied; update = mean / max "
             "wall seconds of one update.", ""]
    for r in results:
        lines += [f"## {r['stream']} ({r['model']}, {r['requests']} requests, {r['steps']} steps "
                  f"of {r['every']} requests, window {r['window']})", "",
                  "| policy | LAR | imbalance p95 | settled p95 | layer p95 | migrated GB | update s (mean / max) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for n, p in r["policies"].items():
            lines.append(f"| {n} | {p['lar_mean']:.4f} | {p['imbalance_p95']:.3f} | "
                         f"{p['imbalance_p95_settled']:.3f} | "
                         f"{p['imbalance_layer_p95']:.3f} | {p['migrated_bytes'] / 1e9:.1f} | "
                         f"{p['solve_s_mean']:.2f} / {p['solve_s_max']:.2f} |")
        v = r["verdicts"]
        lines += ["", f"Verdicts: static drifts above 1.15: {v['static_drifts']}; incremental LAR "
                  f"{v['lar_vs_resolve']:.3f} x resolve's (>= 0.95: {v['inc_lar_ge_0.95_resolve']}),"
                  f" bytes {v['bytes_vs_resolve']:.3f} x resolve's (<= 0.20: "
                  f"{v['inc_bytes_le_0.2_resolve']}), imbalance p95 <= 1.10: "
                  f"{v['inc_imbalance_p95_le_1.10']}; against eplb-periodic: LAR higher "
                  f"{v['vs_eplb_lar_higher']}, imbalance p95 lower {v['vs_eplb_imbalance_lower']}, "
                  f"bytes no more {v['vs_eplb_bytes_no_more']}; against static: LAR no lower "
                  f"{v['vs_static_lar_no_lower']}. Settled (the {sum(r['unseen_steps'])} step(s) "
                  f"right after a switch to traffic the update window had not seen left out): "
                  f"incremental p95 <= 1.10: {v['inc_settled_p95_le_1.10']}, lower than "
                  f"eplb-periodic's: {v['vs_eplb_settled_p95_lower']}.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default=",".join(STREAMS))
    ap.add_argument("--ep", type=int, default=4)
    ap.add_argument("--max-moves", type=int, default=32)
    ap.add_argument("--max-imbalance", type=float, default=1.05)
    ap.add_argument("--history", type=int, default=3,
                    help="sempar-incremental: windows of load history (0: the window alone)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--append", action="store_true", help="add to the results --json holds")
    ap.add_argument("--from", dest="from_", type=Path, help="read results instead of running")
    ap.add_argument("--table", type=Path, help="write the markdown page here")
    a = ap.parse_args()
    if a.from_:
        results = json.loads(a.from_.read_text())
        for r in results:
            settle(r)
    else:
        results = json.loads(a.json.read_text()) if a.append and a.json.exists() else []
        for name in a.streams.split(","):
            r = run_stream(name, a.ep, a.max_moves, a.max_imbalance, a.history)
            results.append(r)
            for n, p in r["policies"].items():
                print(f"{name:14s} {n:20s} LAR {p['lar_mean']:.4f}  imb p95 "
                      f"{p['imbalance_p95']:.3f}  migrated {p['migrated_bytes'] / 1e9:7.1f} GB  "
                      f"update {p['solve_s_mean']:.2f} s", flush=True)
            print(f"{name:14s} verdicts {r['verdicts']}", flush=True)
            if a.json:               # after every stream: a late stream cannot lose the others
                a.json.write_text(json.dumps(results, indent=1) + "\n")
    if a.table:
        a.table.write_text(table(results))


if __name__ == "__main__":
    sys.exit(main())
