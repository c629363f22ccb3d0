"""Benchmark: held-out exact-home LAR and imbalance of tp placements under both capacity home
rules, every method solved once (`schedule.evaluate.evaluate_modes`, as `sempar evaluate
--split --mode tp` runs it), judged on the eval split with the greedy proposal rounds (the
default, `evaluate`'s `oracle_lar_mean`) and the optimal assignment (`evaluate --home-rule
optimal`).

    python benchmarks/bench_held_out_rules.py --trace PATH --ep 4 [--methods a,b] [--objective rows]

Per method: `held_out_lar` (proposal homes), `held_out_lar_optimal`, `imbalance_max_mean`,
`imbalance_max` (worst layer), `solve_seconds`, and the method's own held-out prediction
(`fit_cap`, `predicted_imbalance`, `within_budget`; the exact solvers' re-predicted on their
partition with sempar's folds, `held_out.derived_held_out`). It asserts nothing; wall times
depend on the load.
"""

from __future__ import annotations

import argparse
import json

from sempar.schedule.evaluate import evaluate_modes, figures_for
from sempar.solve_options import SolveOptions
from sempar.trace import read_trace, split_by_request


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--ep", type=int, required=True)
    ap.add_argument("--methods", default="sempar,sempar-exact,sempar-exact-refine")
    ap.add_argument("--objective", default="rows")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    fit, ev = split_by_request(read_trace(args.trace), seed=args.seed)
    placements: dict = {}
    out = evaluate_modes(fit, ev, args.ep, SolveOptions(objective=args.objective, mode="tp"),
                         methods=args.methods.split(","), modes=("tp",), placements=placements,
                         bound=None)["tp"]
    rows = []
    for name, m in out["methods"].items():
        opt = figures_for(placements[(name, "tp")], ev, "tp", home_rule="optimal")
        held = m.get("held_out", {})
        rows.append({"method": name, "ep": args.ep, "fit_tokens": fit.num_tokens,
                     "eval_tokens": ev.num_tokens, "held_out_lar": round(m["oracle_lar_mean"], 4),
                     "held_out_lar_optimal": round(opt["oracle_lar_mean"], 4),
                     "imbalance_max_mean": round(m["imbalance_max_mean"], 4),
                     **{k: m[k] for k in ("imbalance_max", "solve_seconds") if k in m},
                     **{k: held[k] for k in ("fit_cap", "predicted_imbalance", "within_budget")
                        if k in held}})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
