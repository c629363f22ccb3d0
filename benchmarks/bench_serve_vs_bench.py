"""Benchmark: the serving forecast against real execution (issue 17, "the per-layer time it
forecasts for `sempar bench`'s configuration within 20 % of what bench measures").

Takes a `sempar bench --json` result and, per method, forecasts the per-layer time of bench's
prefill iteration with the serving predictor (serving/benchcheck.py), then prints forecast,
measured and their ratio. Measured once here: one single-process fp32 forward of a bench batch
(`batch_size` x `seq` held-out tokens of the dev text, 1 thread as each bench rank runs, min of
`--repeats` after a warm-up), which calibrates the `cpu` roofline. Topology: `--topology` (the
testbed as `sempar profile --hosts G --testbed PRESET --out topo.json` measured it), else the
bench's preset cut to G hosts with its bandwidth scaled by bench's `scale` (the shaping; alpha
stays the preset's, which the testbed cannot shape).

    sempar bench --hosts 4 --json > bench.json            # root, netns; minutes
    sempar profile --hosts 4 --testbed pcie-upi8 --out topo.json
    sempar profile --ep 4 --testbed pcie-upi8 --method all_to_all_single --out topo.json
    python benchmarks/bench_serve_vs_bench.py bench.json --topology topo.json [--json]
        [--collectives nccl|gloo]

The topology profiled with gloo's all_to_all_single carries the `gloo` collective model and its
measured serialisation (comm/collective_models.py), which then prices every collective;
`--collectives nccl` prices the same bytes by eq. 9 and rings (the papers' engines).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _time_forward(model: str, ids, repeats: int, barrier=None) -> float:
    """Min over `repeats` of one forward of ids int64[B, S], 1 thread, after a warm-up."""
    import torch

    from sempar.models import load_model

    torch.set_num_threads(1)
    m = load_model(model)
    best = float("inf")
    with torch.no_grad():
        m(input_ids=ids)                                    # warm-up
        if barrier is not None:
            barrier.wait()                                  # the G ranks compute together
        for _ in range(repeats):
            t0 = time.perf_counter()
            m(input_ids=ids)
            best = min(best, time.perf_counter() - t0)
    return best


def _rank(args) -> float:
    model, ids, repeats, barrier = args
    return _time_forward(model, ids, repeats, barrier)


def forward_seconds(model: str, batch_size: int, seq: int, repeats: int, ranks: int) -> float:
    """Compute seconds of bench's batch: with ranks = 1 one process forwards the whole batch;
    with ranks = G, G processes at once each forward batch_size / G of its requests (bench's
    process layout on this machine's cores) and the median of their times is returned."""
    import multiprocessing as mp

    from sempar.bench.inputs import load_dev, prefill_batches

    _, held = load_dev(model)
    ids = prefill_batches(held, 1, batch_size, seq)[0]
    if ranks == 1:
        return _time_forward(model, ids, repeats)
    ctx = mp.get_context("spawn")
    with ctx.Manager() as mgr:
        barrier = mgr.Barrier(ranks)
        chunks = ids.chunk(ranks)
        with ctx.Pool(ranks) as pool:
            times = pool.map(_rank, [(model, c, repeats, barrier) for c in chunks])
    return float(np.median(times))


def bench_topology(bench: dict, path: str | None):
    from sempar.comm.topology import Topology
    from sempar.comm.topology_presets import load_topology
    from sempar.testbed.shaping import resolve_preset

    if path:
        return load_topology(path)
    if not bench.get("preset") or not bench.get("scale"):
        raise SystemExit("the bench ran over loopback: give --topology (sempar profile --hosts G)")
    t = resolve_preset(bench["preset"], int(bench["hosts"]))
    return Topology(f"{t.name}x{bench['scale']:g}", t.node_of, t.alpha, t.beta / bench["scale"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bench", help="a `sempar bench --json` result")
    ap.add_argument("--topology", default=None, help="profiled topology JSON of the testbed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrent", action="store_true", help="calibrate compute with G processes "
                    "at once, each forwarding 1/G of the batch (bench's layout), not one process")
    ap.add_argument("--collectives", default=None, help="collective model (nccl, gloo); "
                    "default: the topology's (gloo when profiled with all_to_all_single)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from sempar.paths import assets_dir
    from sempar.comm.collective_models import collective_model
    from sempar.serving.benchcheck import RUNTIME_SIM, bench_dims, calibrated_cpu, compare_bench
    from sempar.serving.dims import model_dims
    from sempar.serving.forecast import Forecaster, clean
    from sempar.trace import read_trace

    with open(a.bench) as f:
        bench = json.load(f)
    model, B, S = bench["model"], int(bench["batch_size"]), int(bench["seq"])
    t0 = time.perf_counter()
    ranks = int(bench["hosts"]) if a.concurrent else 1
    if B % ranks:
        raise SystemExit(f"--concurrent: {B} requests do not split over {ranks} ranks")
    fwd = forward_seconds(model, B, S, a.repeats, ranks)
    dims = bench_dims(model_dims(model))
    acc = calibrated_cpu(dims, B // ranks, S, fwd)
    topo = bench_topology(bench, a.topology)
    cm = collective_model(topo, a.collectives).name
    fc = Forecaster(read_trace(assets_dir() / "traces" / f"{model}.parquet"), dims, topo, acc,
                    sim={**RUNTIME_SIM, "collectives": cm})
    res = compare_bench(bench, fc)
    ratios = np.array([r["ratio"] for r in res.values()])
    out = {"bench": a.bench, "model": model, "hosts": fc.G, "topology": topo.name,
           "collectives": cm, "a2a_serialisation": (topo.collectives or {}).get("a2a_serialisation"),
           "batch": [B, S], "calibration": {"processes": ranks, "requests_each": B // ranks,
                                             "forward_seconds": fwd},
           "calibrated_flops": acc.flops, "calibrated_bw": acc.mem_bw, "methods": res,
           "within_20pct": int((np.abs(ratios - 1) <= 0.2).sum()), "of": len(res),
           "wall_seconds": time.perf_counter() - t0}
    if a.json:
        print(json.dumps(clean(out), indent=1))
        return
    print(f"{model}, G = {fc.G}, topology {topo.name}, collectives {cm} (a2a serialisation "
          f"{out['a2a_serialisation']}), batch {B} x {S}; forward of {B // ranks} "
          f"requests in {ranks} process(es) at once, {fwd * 1e3:.1f} ms (1 thread each), "
          "calibrates the cpu roofline")
    ms = lambda x: "-" if x is None else f"{x * 1e3:.1f}"  # noqa: E731
    print(f"{'method':<16} {'pipeline':<15} {'layer ms fc/meas':>17} {'ratio':>6} "
          f"{'MoE block fc/meas':>18} {'attn comm fc/meas':>18}  LAR fc/meas")
    for n, r in res.items():
        print(f"{n:<16} {r['pipeline']:<15} "
              f"{ms(r['forecast_layer_seconds']):>8}/{ms(r['measured_layer_seconds']):<8} "
              f"{r['ratio']:>6.2f} {ms(r['forecast_moe_block_seconds']):>9}/"
              f"{ms(r['measured_moe_block_seconds']):<8} "
              f"{ms(r['forecast_attn_comm_seconds']):>9}/{ms(r['measured_attn_comm_seconds']):<8}  "
              f"{r['lar_forecast']:.3f}/{r['lar_measured']:.3f}")
    print(f"within 20 %: {out['within_20pct']} of {out['of']} methods")


if __name__ == "__main__":
    main()
