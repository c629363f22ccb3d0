"""Benchmark: placement quality on held-out routing (issue 4), every registered method side by side.

For each trace (the committed dev traces, and a synthetic preset), fit on 20% of the requests,
evaluate on the other 80%, at each EP degree and mode; prints LAR, oracle LAR, imbalance and
solve time, and each method's LAR as a ratio of vanilla's. Targets (issue 4): semmoe (or
smoe-cem) highest LAR of the deployable methods with imbalance <= 1.10, and >= 1.6x vanilla on
64-expert traces at EP 4 in tp mode. This script reports what it measures; it asserts nothing.

    python benchmarks/bench_placement.py [--ep 4 8] [--modes tp dp] [--synth olmoe-1b-7b:100000]
"""

from __future__ import annotations

import argparse

from sempar.paths import dev_trace_paths
from sempar.placement import SOLVERS
from sempar.placement.evaluate import evaluate
from sempar.trace import read_trace, split_by_request
from sempar.trace.synth import synthesize


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ep", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--modes", nargs="+", default=["tp", "dp"])
    ap.add_argument("--synth", default="olmoe-1b-7b:100000", help="PRESET:TOKENS, or '' for none")
    ap.add_argument("--methods", default=",".join(SOLVERS.names()))
    args = ap.parse_args()
    traces = {p.stem: read_trace(p) for p in dev_trace_paths()}
    if args.synth:
        preset, n = args.synth.split(":")
        traces[f"synthetic {preset}"] = synthesize(preset, int(n), seed=1)
    methods = args.methods.split(",")
    for name, trace in traces.items():
        fit, ev = split_by_request(trace, seed=0)
        for ep in args.ep:
            if ep > trace.meta.num_experts:
                continue
            for mode in args.modes:
                res = evaluate(fit, ev, ep, methods=methods, mode=mode)
                base = res["methods"].get("vanilla", {}).get("lar_mean")
                print(f"\n{name}: EP {ep}, {mode} mode, {ev.num_tokens} held-out tokens")
                print(f"{'method':<12} {'LAR':>6} {'xvanilla':>8} {'oracle':>7} {'imb max/mean':>12} "
                      f"{'copies':>7} {'solve s':>8}")
                for m, r in sorted(res["methods"].items(), key=lambda kv: -kv[1]["lar_mean"]):
                    ratio = r["lar_mean"] / base if base else float("nan")
                    print(f"{m:<12} {r['lar_mean']:6.3f} {ratio:8.2f} {r['oracle_lar_mean']:7.3f} "
                          f"{r['imbalance_max_mean']:12.3f} {r['remote_copies_per_token']:7.2f} "
                          f"{r['solve_seconds']:8.2f}")


if __name__ == "__main__":
    main()
