"""Benchmark: whether `evaluate --online`'s schedulers should take the optimal home rule too
(issue 46), side by side in one run.

The exact pre-router and `evaluate`'s tp oracle homes know each token's real experts, so their
hit rows are small integers and the optimal rule (`capacity.ASSIGN_RULES["optimal"]`, a
transportation problem over the distinct rows) is exact and cheap. The online schedulers only
predict: Alg. 3's T|A gives one device per token (its align step already puts the most tokens
possible on their predicted devices, min(share, askers) per device, so no rule can do better
there), and the expected-hits scheduler (`OnlineScheduler.home_tp_hits`, ours) gives a float
score per device, homed by either rule (`home_tp_hits(rule=)`: proposal rounds through
`rebatch.plan_align` with scores, the only path before issue 46, or the optimal rule on the
scores quantised to 1 / `online.HITS_SCALE`, every token nearly its own row type, the default
since). This benchmark runs both and reports the held-out LAR on the real routing and the
time a (batch, layer) of each (scores included), beside the exact pre-router's two rules on the
same placement.

Per (trace, EP): `--method` (default `metis`: the online schedulers take any placement) solved
on the 20 % fit split (`split_by_request`, seed 0), the schedulers fitted there, judged on the
other 80 %. Needs token ids (GPT-OSS-20B's MMLU trace has them, DeepSeek-V2-Lite's does not).

    python benchmarks/bench_online_home_rule.py [--trace gpt=PATH] [--ep 4 8] [--json]

It asserts nothing; wall times depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rows_speed import ensure_trace, trace_options  # noqa: E402

from sempar.placement import solve  # noqa: E402
from sempar.placement.capacity import BATCH, capacity_home  # noqa: E402
from sempar.placement.metrics import placement_figures  # noqa: E402
from sempar.schedule.homes import local_hits  # noqa: E402
from sempar.schedule.online import HITS_SCALE, OnlineScheduler  # noqa: E402
from sempar.trace import read_trace, split_by_request  # noqa: E402


def _lar(placement, experts: np.ndarray, home: np.ndarray) -> float:
    return float(placement_figures(placement, experts, home)["lar_mean"])


def case(name: str, path: Path, ep: int, method: str) -> dict:
    fit, ev = split_by_request(read_trace(path), seed=0)
    p = solve(method, fit, num_devices=ep, mode="tp")
    sched = OnlineScheduler().fit(fit, p)
    sched.home_tp_hits(ev.take(np.arange(1)))                    # fits the expected hits once
    T, L = ev.num_tokens, ev.meta.num_layers
    units = L * -(-T // BATCH)                                               # (batch, layer)s
    row = {"trace": name, "ep": ep, "method": method, "eval_tokens": T, "scale": HITS_SCALE}
    for rule in ("proposal", "optimal"):                         # the online expected hits
        t0 = time.perf_counter()
        home = sched.home_tp_hits(ev, rule)
        row[f"ms_hits_{rule}"] = round(1e3 * (time.perf_counter() - t0) / units, 3)
        row[f"lar_hits_{rule}"] = round(_lar(p, ev.experts, home), 4)
    for rule in ("proposal", "optimal"):                                      # exact pre-router
        home = np.empty((T, L), np.int32)
        secs = 0.0
        for l in range(L):
            hits = local_hits(p, ev.experts, l)
            t0 = time.perf_counter()
            home[:, l] = capacity_home(hits, BATCH, rule=rule)
            secs += time.perf_counter() - t0
        row[f"ms_exact_{rule}"] = round(1e3 * secs / units, 3)
        row[f"lar_exact_{rule}"] = round(_lar(p, ev.experts, home), 4)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    trace_options(ap, ["gpt"], [4, 8])
    ap.add_argument("--method", default="metis")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    given = dict(t.split("=", 1) for t in args.trace)
    rows = []
    for name in args.cases:
        path = ensure_trace(name, given, Path(args.cache_dir))
        for ep in args.ep:
            row = case(name, path, ep, args.method)
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
