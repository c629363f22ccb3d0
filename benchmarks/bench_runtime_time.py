"""Benchmark: how long the runtime takes to run a group of cases and to fail fast on a dead or
hung rank (the figures tests/runtime/test_runtime.py used to assert as `elapsed < 300` / `< 60`).

For each (model, G): one spawned process group runs every mode on the vanilla placement
(`run_many`, the test's grouping), timed beside its budget. Then the test's two fault cases
(tiny-mixtral, G = 2, attn-dp, op timeout 5 s): rank 1 exits, or hangs, at layer 1; the time
until `RankFailure` is raised, beside the 60 s budget. Ratios below 1 meet the budget.

    python benchmarks/bench_runtime_time.py [--groups tiny-moe64:2,tiny-mixtral:2] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from sempar.models import resolve_model
from sempar.placement.placement import Placement
from sempar.runtime import MODES, RankFailure, RunSpec, run, run_many

GROUP_BUDGET_S = 300.0      # one group of cases, spawn and model load included
FAIL_FAST_BUDGET_S = 60.0   # a dead or hung rank reported


def vanilla(model: str, G: int) -> Placement:
    cfg = json.loads((resolve_model(model).model_dir / "config.json").read_text())
    L, N = cfg["num_hidden_layers"], cfg["num_local_experts"]
    return Placement(np.tile(np.arange(N), (L, 1)), N, G, method="vanilla").validate()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="tiny-moe64:2,tiny-mixtral:2")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for item in a.groups.split(","):
        model, G = item.split(":")[0], int(item.split(":")[1])
        ids = torch.randint(2, 8192, (4, 12), generator=torch.Generator().manual_seed(0))
        specs = [RunSpec(model, ids, vanilla(model, G), m) for m in MODES]
        t0 = time.perf_counter()
        run_many(specs, G, deadline=600)
        s = time.perf_counter() - t0
        rows.append({"case": f"group {model} G={G} ({len(specs)} modes)", "seconds": s,
                     "budget_s": GROUP_BUDGET_S, "ratio": s / GROUP_BUDGET_S})
    for kind in ("exit", "hang"):
        spec = RunSpec("tiny-mixtral", torch.randint(2, 8192, (2, 8)), vanilla("tiny-mixtral", 2),
                       "attn-dp", timeout=5.0, fault={"rank": 1, "layer": 1, "kind": kind})
        t0 = time.perf_counter()
        try:
            run(spec, 2, deadline=90, grace=3)
            failed = False
        except RankFailure:
            failed = True
        s = time.perf_counter() - t0
        rows.append({"case": f"rank 1 {kind}s (op timeout 5 s)", "seconds": s, "failed": failed,
                     "budget_s": FAIL_FAST_BUDGET_S, "ratio": s / FAIL_FAST_BUDGET_S})
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'case':44s} {'seconds':>8s} {'budget':>7s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['case']:44s} {r['seconds']:8.1f} {r['budget_s']:7.0f} {r['ratio']:6.2f}"
              + ("" if r.get("failed", True) else "  (no RankFailure!)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
