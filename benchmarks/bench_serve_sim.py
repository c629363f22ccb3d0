"""Benchmark: the serving simulator (`sempar serve-sim`), wall time against the issue's targets.

(a) one 30-minute simulated run of a Qwen3-30B-A3B-shaped model at EP 8 on pcie-upi8, H100
    roofline, SGLang baseline (vanilla placement, round-robin, sglang-ep), Poisson arrivals at
    `--rate` (default 30 req/s: >= 50k requests), 512 in / 128 out. The trace is synthetic
    (`sempar synth --preset qwen3-30b-a3b --tokens 200000 --out PATH`, made here when absent).
    Prints the wall and CPU seconds to prepare (placement, homes, step table) and to run the
    event loop (CPU seconds: this machine's 2 cores are shared, the wall depends on the load).
    Target: <= 60 s in all.
(b) with --sweep: a 10-rate sweep x 6 systems (sglang, sglang-eplb, semmoe-dp, semmoe-tp, smoe,
    ds-moe) on the same trace, `--sweep-duration` seconds of arrivals per rate. Target: <= 10 min.

    python benchmarks/bench_serve_sim.py [--trace PATH] [--rate 30] [--duration 1800] [--sweep]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from sempar.comm.topology_presets import load_topology
from sempar.serving.dims import model_dims
from sempar.serving.forecast import Forecaster, compare
from sempar.serving.workload import WorkloadSpec
from sempar.serving.hardware import ACCELERATORS
from sempar.serving.systems import resolve
from sempar.trace import read_trace

TRACE = "/tmp/sempar-bench/qwen3-200k.parquet"
# ds-moe before the other TP systems: it is the TP baseline whose light load sets their SLOs
SWEEP_SYSTEMS = ["sglang", "sglang-eplb", "semmoe-dp", "ds-moe", "semmoe-tp", "smoe"]


def ensure_trace(path: str) -> None:
    if os.path.exists(path):
        return
    from sempar.trace.synth import SynthGenerator

    SynthGenerator("qwen3-30b-a3b", 200_000, None, 0).write(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--duration", type=float, default=1800.0)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-only", action="store_true", help="skip (a)")
    ap.add_argument("--sweep-duration", type=float, default=60.0)
    args = ap.parse_args()
    os.makedirs(os.path.dirname(args.trace) or ".", exist_ok=True)
    ensure_trace(args.trace)
    tr = read_trace(args.trace)
    t0, c0 = time.perf_counter(), time.process_time()
    fc = Forecaster(tr, model_dims("qwen3-30b-a3b"), load_topology("pcie-upi8"), ACCELERATORS.get("h100"))
    out: dict = {}
    if args.sweep_only:
        sweep(fc, args, out)
        return
    p = fc.prepare(resolve("sglang").variants[0])
    t1, c1 = time.perf_counter(), time.process_time()
    m = fc.run_rate(p, args.rate, args.duration, "fixed", 512, 128)
    t2, c2 = time.perf_counter(), time.process_time()
    out["a_30min_run"] = {"requests": m["requests"], "finished": m["finished"],
                           "iterations": m["iterations"], "prepare_s": t1 - t0, "run_s": t2 - t1,
                           "total_s": t2 - t0, "cpu_prepare_s": c1 - c0, "cpu_run_s": c2 - c1,
                           "cpu_total_s": c2 - c0, "target_s": 60, "ttft_p99": m["ttft_p99"],
                           "e2e_p50": m["e2e_p50"], "throughput": m["throughput"]}
    print(json.dumps(out), flush=True)
    if args.sweep:
        sweep(fc, args, out)


def sweep(fc: Forecaster, args, out: dict) -> None:
    """(b): the 10-rate x 6-system sweep; wall and CPU seconds (prepare / runs)."""
    t3, c3 = time.perf_counter(), time.process_time()
    phases = {"prepare": 0.0, "run": 0.0}
    last = [time.process_time(), "prepare"]

    def progress(msg: str) -> None:       # CPU seconds per phase, split at each step
        now = time.process_time()
        phases[last[1]] += now - last[0]
        last[:] = [now, "prepare" if msg.startswith("prepare") else "run"]
        # on stderr as it goes, so a run cut short still tells where its time went
        sys.stderr.write(f"{time.perf_counter() - t3:8.1f} s wall {now - c3:8.1f} s CPU  {msg}\n")

    res = compare(fc, SWEEP_SYSTEMS, WorkloadSpec(duration=args.sweep_duration), progress=progress)
    phases[last[1]] += time.process_time() - last[0]
    out["b_sweep"] = {"systems": SWEEP_SYSTEMS, "rates": res["rates"],
                      "duration_per_rate_s": args.sweep_duration,
                      "wall_s": time.perf_counter() - t3, "cpu_s": time.process_time() - c3,
                      "cpu_prepare_s": phases["prepare"], "cpu_runs_s": phases["run"],
                      "target_s": 600, "requests_simulated":
                      sum(p["requests"] for s in res["systems"].values() for p in s["curve"]),
                      "throughput_under_slo": {n: s["throughput_under_slo"]
                                               for n, s in res["systems"].items()}}
    print(json.dumps(out["b_sweep"]), flush=True)


if __name__ == "__main__":
    main()
