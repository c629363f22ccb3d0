"""Benchmark: which hypergraph objective tracks exact-home LAR (issue 46 item 1).

Per (trace, EP, start) on the whole real trace, every MoE layer's distinct expert sets as
weighted hyperedges over load-weighted experts (placement/sempar/hypergraph.py): the start's
partition repaired to N / G experts a device, BEFORE any refinement, and its capacity-bound
exact-home LAR in-sample (`schedule.optimality.in_sample`, the figure the bound bounds) and load
imbalance (max / mean device load, worst layer), with the partitioner's wall time. Starts:
Mt-KaHyPar with km1, soed and cut (epsilon = --epsilon, `--preset`), and METIS on the
token-expert graph (`graph_baselines.metis_layer`, sempar's other start). The solver keeps
whichever start refines better (`sempar-hypergraph`); this table says which objective gives
it the better place to start from (the objectives' own values are not comparable with each
other, so the comparison is the LAR each reaches and at what balance).

    python benchmarks/bench_hypergraph.py [--cases gpt dsv2] [--ep 4 8] [--json]

Traces as bench_rows_speed.py's (the real full traces, imported into --cache-dir). Asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from bench_rows_speed import TRACES, ensure_trace
from sempar.affinity.affinity_stats import AffinityStats
from sempar.placement.graph_baselines import metis_layer
from sempar.placement.placement import Placement
from sempar.placement.sempar.hypergraph import hypergraph_start
from sempar.placement.sempar.row_sets import layer_trace
from sempar.placement.sempar.rows import row_trace
from sempar.schedule.optimality import in_sample
from sempar.trace import read_trace

STARTS = ("km1", "soed", "cut", "metis")


def case(name: str, path: Path, ep: int, eps: float, preset: str) -> list[dict]:
    trace = read_trace(path)
    rows = row_trace(trace, trace.num_tokens, 0)
    L, N = trace.meta.num_layers, trace.meta.num_experts
    parts = {s: [] for s in STARTS}
    secs = {s: 0.0 for s in STARTS}
    for l in range(L):
        stats = AffinityStats(layer_trace(rows, l))
        C = stats.counts(0)
        for s in STARTS:
            t0 = time.perf_counter()
            if s == "metis":
                dev = metis_layer(C.toarray().astype(np.int64), stats.a, ep, 0)[0]
            else:
                dev = hypergraph_start(C, stats.a, ep, eps, 0, s, preset)
            secs[s] += time.perf_counter() - t0
            parts[s].append(np.argsort(dev, kind="stable"))
    out = []
    for s in STARTS:
        lar, imb = in_sample(Placement(np.stack(parts[s]), N, ep), trace.experts)
        out.append({"trace": name, "ep": ep, "start": s, "epsilon": eps, "preset": preset,
                    "lar": round(float(lar.mean()), 4), "imbalance_max": round(float(imb.max()), 4),
                    "imbalance_mean": round(float(imb.mean()), 4),
                    "seconds": round(secs[s], 2)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--cases", nargs="+", default=["gpt", "dsv2"], choices=list(TRACES))
    ap.add_argument("--ep", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--preset", default="default")
    ap.add_argument("--cache-dir", default=os.environ.get("SEMPAR_BENCH_CACHE",
                                                          "/tmp/sempar-bench-rows"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    given = dict(t.split("=", 1) for t in args.trace)
    rows = []
    for name in args.cases:
        path = ensure_trace(name, given, Path(args.cache_dir))
        for ep in args.ep:
            for r in case(name, path, ep, args.epsilon, args.preset):
                rows.append(r)
                if not args.json:
                    print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
