"""Benchmark: the two capacity-bound home rules side by side (`placement.capacity.ASSIGN_RULES`):
the greedy proposal rounds (the default until issue 46) and the optimal assignment
(`placement.transport`, the default since), on held-out routing.

Per (trace, EP): `sempar` solves the rows objective on the 20 % fit split (`split_by_request`,
seed 0, as `evaluate --split` and `bench_rows_speed.py --held-out`); on the other 80 % each rule
homes every (token, layer) knowing its real experts, equal shares per 2,048-token batch (the
exact pre-router's homes, pipeline `smoe-exact`), and the row reports its exact-home LAR
(`held_out_<rule>`), the gain of the optimal rule, and each rule's wall time per layer
(`ms_per_layer_<rule>`, the whole eval split's batches of one layer) and per batch.

    python benchmarks/bench_home_rules.py [--trace NAME=PATH ...] [--ep 4 8] [--json]
    python benchmarks/bench_home_rules.py --table docs/results/home-rules.json

Traces as in bench_rows_speed.py (NAME dsv2 or gpt; default the real full traces). It asserts
nothing; wall times depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rows_speed import (TRACES, ensure_trace, parse_or_table,  # noqa: E402
                              trace_options)

from sempar.placement.base import PlacementProblem  # noqa: E402
from sempar.placement.capacity import ASSIGN_RULES, BATCH, capacity_home  # noqa: E402
from sempar.placement.sempar.config import SemparConfig  # noqa: E402
from sempar.placement.sempar.solver import sempar_solve  # noqa: E402
from sempar.schedule.homes import local_hits  # noqa: E402
from sempar.trace import read_trace, split_by_request  # noqa: E402


def rule_figures(placement, experts: np.ndarray) -> dict:
    """{rule: (exact-home LAR over every layer, seconds per layer)} for each rule on
    experts int[T, L, k] (placement without replicas: a token's hits are its local experts)."""
    T, L, k = experts.shape
    out = {}
    for rule in ASSIGN_RULES.names():
        local, secs = 0, 0.0
        for l in range(L):
            hits = local_hits(placement, experts, l)
            t0 = time.perf_counter()
            home = capacity_home(hits, BATCH, rule=rule)
            secs += time.perf_counter() - t0
            local += int(hits[np.arange(T), home].sum())
        out[rule] = (local / (T * L * k), secs / L)
    return out


def case(name: str, path: Path, ep: int) -> dict:
    trace = read_trace(path)
    fit, eval_ = split_by_request(trace, seed=0)
    t0 = time.perf_counter()
    placement = sempar_solve(PlacementProblem(fit, ep, objective="rows"), SemparConfig())
    solve_s = time.perf_counter() - t0
    figs = rule_figures(placement, eval_.experts)
    batches = -(-eval_.num_tokens // BATCH)
    row = {"trace": name, "ep": ep, "fit_tokens": fit.num_tokens,
           "eval_tokens": eval_.num_tokens, "solve_s": round(solve_s, 1)}
    for rule, (lar, spl) in figs.items():
        row[f"held_out_{rule}"] = round(lar, 4)
        row[f"ms_per_layer_{rule}"] = round(1e3 * spl, 1)
        row[f"ms_per_batch_{rule}"] = round(1e3 * spl / batches, 2)
    row["gain"] = round(figs["optimal"][0] - figs["proposal"][0], 4)
    return row


def table(rows: list[dict]) -> str:
    """The markdown table of docs/results/home-rules.md from this benchmark's --json rows."""
    names = {"dsv2": "DeepSeek-V2-Lite", "gpt": "GPT-OSS-20B"}
    out = ["| case | fit / eval tokens | exact-home LAR, proposal rounds | exact-home LAR, "
           "optimal | gain | ms a layer, proposal | ms a layer, optimal | ms a batch, optimal |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {names.get(r['trace'], r['trace'])} EP {r['ep']} | {r['fit_tokens']:,} / "
                   f"{r['eval_tokens']:,} | {r['held_out_proposal']:.4f} | "
                   f"{r['held_out_optimal']:.4f} | {r['gain']:+.4f} | "
                   f"{r['ms_per_layer_proposal']} | {r['ms_per_layer_optimal']} | "
                   f"{r['ms_per_batch_optimal']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    trace_options(ap, list(TRACES), [4, 8])
    args = parse_or_table(ap, argv, table)
    if args is None:
        return
    given = dict(t.split("=", 1) for t in args.trace)
    rows = []
    for name in args.cases:
        path = ensure_trace(name, given, Path(args.cache_dir))
        for ep in args.ep:
            row = case(name, path, ep)
            rows.append(row)
            print(json.dumps(row) if args.json else
                  " ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
