"""Benchmark: the communication simulator (`sempar simulate`), speed and sempar against vanilla.

(a) scale: 1M tokens x 48 layers x top-8 (qwen3-30b-a3b synthetic trace, made by
    `sempar synth --preset qwen3-30b-a3b --tokens 1000000 --seed 1 --out /work/cache/scale/qwen3-1m.parquet`),
    EP 8 on pcie-upi8, hidden 2048 bf16: seconds of `simulate` per pipeline (reading excluded;
    homes: vanilla TP chunks / DP round-robin), without replicas and with 8 redundant experts
    (nearest-replica path). Target: <= 20 s each.
(b) sempar vs vanilla, side by side in one run on the tiny-moe64 dev trace (20% fit / 80%
    simulated), EP 8, on pcie-upi8 and a100x4-ib with 2 nodes: per pipeline the all-to-all
    time ratio (CAMoE eq. 9, vanilla / sempar, mean per batch), the ratio of all communication
    (rings included), the bytes ratio (sempar / vanilla) and LAR. semmoe's placement comes with
    the online schedulers (Sem-MoE Alg. 2 / 3), vanilla with contiguous chunks / round-robin.
    At the model's hidden size (128) and at a production one (2048: Qwen3-30B-A3B), since with
    128 the messages are so small that alpha (latency) dominates.

    python benchmarks/bench_simulate.py [--scale-trace PATH] [--skip-scale] [--repeats 1]
                                        [--hidden 128 2048] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from sempar.comm.compare import Study, run_grid, with_options
from sempar.comm.pipelines import PIPELINES, pipeline_names
from sempar.comm.simulate import SimOptions, simulate
from sempar.comm.topology_presets import topology_preset
from sempar.paths import assets_dir
from sempar.schedule.homes import home_dp_round_robin, home_tp_contiguous
from sempar.placement.placement import Placement
from sempar.trace import read_trace

SCALE_TRACE = "/work/cache/scale/qwen3-1m.parquet"


def replicated(L: int, N: int, G: int) -> Placement:
    """Contiguous placement plus one replica per device of the next device's first expert."""
    S = N // G
    rows = []
    for g in range(G):
        rows.append(np.concatenate([np.arange(g * S, (g + 1) * S), [((g + 1) % G) * S]]))
    return Placement(np.tile(np.concatenate(rows), (L, 1)), N, G)


def bench_scale(path: str, repeats: int) -> dict:
    t0 = time.perf_counter()
    tr = read_trace(path, validate=False)
    read_s = time.perf_counter() - t0
    T, L, k = tr.experts.shape
    N, G = tr.meta.num_experts, 8
    topo = topology_preset("pcie-upi8")
    opts = SimOptions(hidden=2048)
    homes = {"tp": home_tp_contiguous(T, G, L), "dp": home_dp_round_robin(tr.request_id, G, L)}
    out = {"tokens": T, "layers": L, "top_k": k, "read_seconds": read_s, "runs": {}}
    for label, pl in (("no replicas", Placement(np.tile(np.arange(N), (L, 1)), N, G)),
                      ("8 replicas", replicated(L, N, G))):
        for name in ("smoe", "sglang-ep", "exflow"):
            p = PIPELINES.get(name)
            times, cpu = [], []
            for _ in range(repeats):
                t, c = time.perf_counter(), time.process_time()
                r = simulate(tr.experts, homes[p.attention], pl, topo, p, opts)
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            key = f"{name} ({label})"
            out["runs"][key] = {"seconds_min": min(times), "seconds_median": float(np.median(times)),
                                "cpu_seconds_min": min(cpu),
                                "a2a_ms": r["total"]["a2a_seconds_mean"] * 1e3,
                                "lar_mean": r["total"]["lar_mean"]}
            print(f"  {key:28s} {min(times):6.2f} s wall, {min(cpu):6.2f} s CPU (target <= 20 s), "
                  f"load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    return out


def bench_versus(hiddens: list[int]) -> dict:
    tr = read_trace(assets_dir() / "traces" / "tiny-moe64.parquet")
    study = Study.from_trace(tr, SimOptions(hidden=hiddens[0]))
    out = {}
    for h in hiddens:
        study.opts = with_options(study.opts, hidden=h)
        t = time.perf_counter()
        rows = run_grid(study, ["vanilla", "semmoe"], pipeline_names(), ["pcie-upi8", "a100x4-ib"])
        print(f"  hidden {h}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        out[str(h)] = rows
    return out


def print_versus(res: dict) -> None:
    for h, rows in res.items():
        print(f"\n(b) tiny-moe64, EP 8, hidden {h} bf16: sempar (semmoe placement + online "
              f"schedulers) vs vanilla, ratios vanilla/sempar for time, sempar/vanilla for bytes")
        print(f"{'topology':12s} {'pipeline':10s} {'a2a ms van':>10s} {'a2a ms sem':>10s} "
              f"{'a2a x':>6s} {'comm x':>6s} {'bytes x':>7s} {'LAR van':>7s} {'LAR sem':>7s}")
        by = {(r["topology"], r["pipeline"], r["method"]): r for r in rows}
        for (topo, pipe, m), r in by.items():
            if m != "semmoe":
                continue
            v = by[(topo, pipe, "vanilla")]
            fmt = lambda x, f="{:.3f}": "-" if x is None else f.format(x)
            print(f"{topo:12s} {pipe:10s} {v['a2a_seconds_mean'] * 1e3:10.4f} "
                  f"{r['a2a_seconds_mean'] * 1e3:10.4f} {fmt(r['a2a_speedup'], '{:.2f}'):>6s} "
                  f"{fmt(r['comm_speedup'], '{:.2f}'):>6s} {fmt(r['bytes_ratio']):>7s} "
                  f"{fmt(v['lar_mean']):>7s} {fmt(r['lar_mean']):>7s}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-trace", default=SCALE_TRACE)
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--hidden", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = {"cpus": os.cpu_count()}
    if not a.skip_scale:
        if os.path.exists(a.scale_trace):
            print(f"(a) scale: {a.scale_trace}", file=sys.stderr, flush=True)
            res["scale"] = bench_scale(a.scale_trace, a.repeats)
        else:
            print(f"(a) skipped: {a.scale_trace} missing (see the module docstring)", file=sys.stderr)
    print("(b) tiny-moe64 vanilla vs semmoe", file=sys.stderr, flush=True)
    res["versus"] = bench_versus(a.hidden)
    if a.json:
        print(json.dumps(res, indent=1, default=float))
        return
    if "scale" in res:
        s = res["scale"]
        print(f"(a) {s['tokens']} tokens x {s['layers']} layers x top-{s['top_k']}, EP 8, "
              f"pcie-upi8, hidden 2048 (read {s['read_seconds']:.1f} s, not counted)")
        for k, v in s["runs"].items():
            print(f"  {k:28s} {v['seconds_min']:6.2f} s wall {v['cpu_seconds_min']:6.2f} s CPU   "
                  f"a2a {v['a2a_ms']:.3f} ms/batch  "
                  f"LAR {v['lar_mean']:.3f}")
    print_versus(res["versus"])


if __name__ == "__main__":
    main()
