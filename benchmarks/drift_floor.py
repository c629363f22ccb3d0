"""What balance a re-placement can reach on the drift streams: DeepSeek EPLB (load only, the
most balance-minded layout) fitted on (a) the step's own requests (hindsight: no policy sees
them; the floor that 16-64 requests of sampling noise leave), (b) every request served before
the step (all the past a policy could keep), (c) the last window (eplb-periodic's input), each
measured on the step as `sempar replay` measures it (p95 over steps of the mean-over-layers
max/mean served load). Same streams and steps as benchmarks/bench_drift.py.

    python benchmarks/drift_floor.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    from bench_drift import STREAMS, unseen_steps

    from sempar.drift.replay import serve_figures
    from sempar.drift.streams import drift_stream, request_table
    from sempar.paths import assets_dir
    from sempar.placement import solve
    from sempar.trace import read_trace

    for name, (asset, order, k, every, window) in STREAMS.items():
        trace = read_trace(assets_dir() / "traces" / f"{asset}.parquet", optional=("domain",))
        stream = drift_stream(trace, order, switch_every=k, mix=0.8, seed=0)
        _, _, rows, starts = request_table(stream)
        R = starts.size - 1

        def part(a, b):
            return stream.take(rows[starts[a]:starts[b]])

        fits = {"hindsight": lambda a, b: part(a, b), "all-past": lambda a, b: part(0, a),
                "window": lambda a, b: part(max(0, a - window), a)}
        out = {f: [] for f in fits}
        steps = []
        for a in range(window, R, every)[1:]:
            b = min(a + every, R)
            served = part(a, b)
            steps.append({"first_request": a, "requests": b - a})
            for f, fit in fits.items():
                p = solve("eplb", fit(a, b), num_devices=4)
                out[f].append(float(serve_figures(p, served.experts, 2048)[1].mean()))
        unseen = unseen_steps({"asset": asset, "order": order, "switch_every": k,
                               "window": window, "policies": {"x": {"steps": steps}}})
        for f, v in out.items():
            kept = [x for x, u in zip(v, unseen) if not u]
            print(f"{name:13s} eplb fitted on {f:9s}: imbalance p95 {np.percentile(v, 95):.3f}"
                  f"  settled p95 {np.percentile(kept, 95):.3f}  worst unseen step "
                  f"{max([x for x, u in zip(v, unseen) if u] or [float('nan')]):.3f}  | "
                  + " ".join(f"{x:.3f}" for x in v), flush=True)


if __name__ == "__main__":
    main()
