"""Benchmark: the `rows` objective's solve time, old path beside new (issue 35 item 3), and how
far from optimal it is (item 5).

Target (issue 35): `sempar place --objective rows` on DeepSeek-V2-Lite (25,028 real tokens) at
EP 8 within 20 s on the 2-core development machine, without losing held-out exact-home LAR.
The new path (`SemparConfig.row_sets`, placement/sempar/row_sets.py: each layer alone on its
distinct expert sets, layers on forked workers, the token step's early stop) runs beside the
old per-row path (`row_sets=False`, behind the flag for this comparison).

Per (trace, EP, path): `solve_s` (wall of `sempar.placement.solve`, as `sempar place` runs it),
`cpu_s` (CPU of the solve, forked layer workers included), `in_sample` (capacity-bound
exact-home LAR on the whole trace the placement was solved on), `bound` (placement/bound.py:
an upper bound on that figure for ANY placement within beta, computed once per (trace, EP) at
the paths' largest beta; `bound_method` which, `bound_s` / `bound_cpu_s` its wall / CPU), `gap`
= in_sample / bound and `best_known` (per layer the better of sempar's placement and the bound's
LP-rounded one, schedule/optimality.py: the solver's share of the gap is best_known / in_sample),
`in_sample_optimal` / `gap_optimal` the same figure and ratio with the optimal home assignment
per batch (`capacity.ASSIGN_RULES["optimal"]`, placement/transport.py, the default home rule
since issue 46: the page's first columns; `in_sample`, `gap` and `best_known` keep the greedy
proposal rounds; the bound holds for both, docs/placement.md "The exact home rule"),
then with
`--held-out` the placement solved on the 20 % fit split (`evaluate --split`) and its held-out
exact-home LAR and imbalance on the other 80 % (what `evaluate --split --objective rows`
reports as oracle_lar_mean / imbalance_max_mean).

    python benchmarks/bench_rows_speed.py [--trace dsv2=PATH] [--trace gpt=PATH] [--ep 4 8]
        [--paths new old] [--held-out] [--bound-from PREVIOUS.json] [--json]
    python benchmarks/bench_rows_speed.py --table docs/results/optimality-bound.json

Traces default to the real `full-traces/` of shared/data/real (SEMPAR_REAL_DATA), imported
with `sempar import arrays` into --cache-dir. Wall times depend on the machine's load (the
development machine is shared): read `cpu_s` beside them. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sempar.placement.base import PlacementProblem, solve_problem
from sempar.placement.bound import COLGEN_METHOD, lar_upper_bound
from sempar.placement.colgen_bound import ColgenConfig
from sempar.placement.config_ilp import ConfigIlpConfig, tighten_bound
from sempar.placement.device_bound import BoundConfig
from sempar.schedule.optimality import BOUND_REF, in_sample, optimality_refs
from sempar.placement.sempar.config import SemparConfig
from sempar.placement.sempar.solver import sempar_solve
from sempar.schedule.evaluate import figures_for, unconstrained_oracle_lar
from sempar.trace import read_trace, split_by_request

REAL = Path(os.environ.get("SEMPAR_REAL_DATA", Path(__file__).resolve().parents[2] / "shared"
                           / "data" / "real")) / "full-traces"
TRACES = {"dsv2": ("deepseek-v2-lite-esft.npz", "deepseek-v2-lite"),
          "gpt": ("gpt-oss-20b-mmlu.npz", "gpt-oss-20b")}


# path -> SemparConfig settings: "new" the default solver (`sempar`), "old" the per-row path,
# "hypergraph[-OBJ]" `sempar-hypergraph` (a Mt-KaHyPar start beside METIS, km1 unless named)
PATHS = {"new": {}, "old": {}, "hypergraph": {"hypergraph_start": True},
         "hypergraph-soed": {"hypergraph_start": True, "hypergraph_objective": "soed"},
         "hypergraph-cut": {"hypergraph_start": True, "hypergraph_objective": "cut"},
         "hypergraph-quality": {"hypergraph_start": True, "hypergraph_preset": "quality"},
         "exact": {}, "exact-refine": {}}
# paths solved by their registered solver (validated by `base.solve_problem`), not sempar_solve:
# "exact" is `sempar-exact` (placement/exact.py: the integer configuration program's partition
# refined with sempar's moves where the device sets can be listed, else `sempar`)
# "exact-refine" is `sempar-exact-refine` (the same, then per layer a swap pass scored on the
# optimal-home figure, placement/refine.py; at every EP, the MILP left out where it cannot list)
REGISTERED = {"exact": "sempar-exact", "exact-refine": "sempar-exact-refine"}


def ensure_trace(name: str, given: dict, cache: Path) -> Path:
    """The Parquet trace of case `name`: given, cached, or imported from the real npz."""
    if name in given:
        return Path(given[name])
    out = cache / f"{name}.parquet"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        npz, model = TRACES[name]
        subprocess.run([sys.executable, "-m", "sempar.cli", "import", "arrays", str(REAL / npz),
                        "--out", str(out), "--model", model], check=True,
                       stdout=subprocess.DEVNULL)
    return out


def cpu_now() -> float:
    """CPU seconds of this process and its reaped children (the solver's forked workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed_solve(trace, ep: int, path: str):
    """(placement, wall s, cpu s) of the rows objective on `trace` at EP `ep` by `path`."""
    p = PlacementProblem(trace, ep, objective="rows")
    cfg = SemparConfig(row_sets=(path != "old"), **PATHS[path])
    c0, t0 = cpu_now(), time.perf_counter()
    if path in REGISTERED:
        placement = solve_problem(REGISTERED[path], p)
    else:
        placement = sempar_solve(p, cfg)         # validated, as `sempar place` solves it
    return placement, time.perf_counter() - t0, cpu_now() - c0


BOUND_FIELDS = ("bound", "bound_any_balance", "bound_method", "bound_s", "bound_cpu_s",
                "bound_parts", "bound_milp_gap_max", "bound_milp_layers", "bound_lp_mean")


def rows_of(rows: list[dict], name: str, ep: int, paths: list[str] | None = None) -> list[dict]:
    """The rows of an earlier --json output for (trace `name`, EP `ep`), of `paths` if given."""
    return [r for r in rows if r["trace"] == name and r["ep"] == ep
            and (paths is None or r["path"] in paths)]


def reused_bound(rows: list[dict], name: str, ep: int, beta: float, tokens: int) -> dict:
    """The bound fields of a previous --json output's rows for (trace `name`, EP `ep`), whose
    beta (max_imbalance) is at least `beta`: a bound over the placements within that balance is
    one over every placement within `beta` too (any beta where the bound is its "any balance"
    figure, e.g. the row-pair Lagrangian's). The bound bounds any home assignment within the
    caps (docs/placement.md, "The exact home rule"), so it serves both home rules unchanged.
    Also {path: best_known} of those rows (the greedy homes' figure, kept as it was)."""
    mine = rows_of(rows, name, ep)
    if not mine:
        raise SystemExit(f"--bound-from: no row for {name} EP {ep}")
    if mine[0]["tokens"] != tokens:
        raise SystemExit(f"--bound-from: {name}'s bound is for {mine[0]['tokens']} tokens, "
                         f"this trace has {tokens}")
    any_balance = mine[0].get("bound_any_balance", float("inf")) <= mine[0]["bound"] + 1e-12
    if max(r["max_imbalance"] for r in mine) < beta - 1e-4 and not any_balance:
        raise SystemExit(f"--bound-from: {name} EP {ep}'s bound is for beta "
                         f"{mine[0]['max_imbalance']}, below this run's {beta:.4f}")
    out = {k: mine[0][k] for k in BOUND_FIELDS if k in mine[0]}
    out["max_imbalance"] = max(r["max_imbalance"] for r in mine)
    out["best_known"] = {r["path"]: r.get("best_known") for r in mine}
    out["in_sample_before"] = {r["path"]: r["in_sample"] for r in mine}
    return out


def cases(name: str, trace_path: Path, ep: int, paths: list[str], held_out: bool,
          bound_config: BoundConfig = BoundConfig(),
          ilp_config: ConfigIlpConfig | None = ConfigIlpConfig(),
          bound_rows: list[dict] | None = None) -> list[dict]:
    """One row per path at (trace, EP). The bound is computed once for all paths, at the
    largest beta among them (a bound over every placement within that balance is one for
    each), seeded with the best in-sample placement; `bound_s` / `bound_cpu_s` its cost.
    ilp_config: where the device sets can be listed, each layer's bound is also the integer
    configuration program's (`config_ilp.tighten_bound`, the least kept), its HiGHS gap per
    layer reported (`bound_milp_gap_max`); None: the LP bounds only. bound_rows: a previous
    --json output whose bound for this case is reused (`reused_bound`), none computed.
    Each row has both home rules' in-sample figures: `in_sample` / `gap` with the greedy
    proposal rounds (`capacity.ASSIGN_RULES["proposal"]`), `in_sample_optimal` /
    `gap_optimal` with the optimal assignment (`"optimal"`), `optimal_home_s` its time."""
    trace = read_trace(trace_path)
    solved = {p: timed_solve(trace, ep, p) for p in paths}
    beta = PlacementProblem(trace, ep).max_imbalance
    lar = {}
    for p, (placement, _, _) in solved.items():
        ins, imb = in_sample(placement, trace.experts, rule="proposal")
        beta, lar[p] = max(beta, float(imb.max())), float(ins.mean())
    if bound_rows is not None:
        bound = reused_bound(bound_rows, name, ep, beta, trace.num_tokens)
        bound["max_imbalance"] = max(bound["max_imbalance"], round(beta, 4))  # any-balance bound
        return [_reused_row(name, trace, ep, p, pl, wall, cpu, bound)
                for p, (pl, wall, cpu) in solved.items()]
    best = max(lar, key=lar.get)
    start = solved[best][0].phy2log.astype("int64") \
        if solved[best][0].phy2log.shape[1] == trace.meta.num_experts else None
    c0, t0 = cpu_now(), time.perf_counter()
    bound = lar_upper_bound(trace, ep, bound_config, beta, start)
    if ilp_config is not None:
        bound = tighten_bound(trace.experts, trace.meta.num_experts, ep, bound, ilp_config, beta)
    bound_s, bound_cpu = time.perf_counter() - t0, cpu_now() - c0
    rows = []
    for p, (placement, wall, cpu) in solved.items():
        b = optimality_refs(trace, ep, placement, beta, bound=bound,
                            rule="proposal")[BOUND_REF]
        row = {"trace": name, "tokens": trace.num_tokens, "ep": ep, "path": p,
               "solve_s": round(wall, 2), "cpu_s": round(cpu, 2),
               "in_sample": round(b["sempar_in_sample"], 4), "bound": round(b["lar_mean"], 4),
               "gap": round(b["gap"], 4),
               "best_known": round(b.get("best_known_in_sample", b["sempar_in_sample"]), 4),
               "max_imbalance": round(b["max_imbalance"], 4),
               "bound_any_balance": round(b["bound_any_balance"], 4),
               "bound_method": b["bound"], "bound_s": round(bound_s, 1),
               "bound_cpu_s": round(bound_cpu, 1), "bound_parts": bound_config.colgen.parts}
        row.update(_optimal_homes(placement, trace, row["bound"]))
        row.update(_homes_pass(placement))
        gaps = [g for g in bound.get("milp_gap", []) if g is not None]
        if gaps:
            row.update(bound_milp_gap_max=round(max(gaps), 6),
                       bound_milp_layers=len(gaps),
                       bound_lp_mean=round(float(sum(bound["lp_per_layer"])
                                                 / len(bound["lp_per_layer"])), 4))
        if held_out:
            fit, eval_ = split_by_request(trace, seed=0)
            pl, wall2, cpu2 = timed_solve(fit, ep, p)
            f = figures_for(pl, eval_, "tp", unconstrained_oracle_lar(pl, eval_))
            row.update(split_solve_s=round(wall2, 2), split_cpu_s=round(cpu2, 2),
                       held_out_exact_lar=round(f["oracle_lar_mean"], 4),
                       held_out_imbalance=round(f["imbalance_max_mean"], 4))
        rows.append(row)
    return rows


def _optimal_homes(placement, trace, bound: float) -> dict:
    """{in_sample_optimal, gap_optimal, optimal_home_s}: `placement`'s in-sample exact-home LAR
    with the optimal home assignment per batch, its ratio to `bound`, the wall seconds it took."""
    t0 = time.perf_counter()
    lar = float(in_sample(placement, trace.experts, rule="optimal")[0].mean())
    return {"in_sample_optimal": round(lar, 4), "gap_optimal": round(lar / bound, 4),
            "optimal_home_s": round(time.perf_counter() - t0, 2)}


def _reused_row(name, trace, ep, path, placement, wall, cpu, bound) -> dict:
    """A row whose bound comes from a previous run (`reused_bound`); `in_sample_before` the
    greedy figure that run reported for this path (equal unless the solver changed)."""
    ins = float(in_sample(placement, trace.experts, rule="proposal")[0].mean())
    row = {"trace": name, "tokens": trace.num_tokens, "ep": ep, "path": path,
           "solve_s": round(wall, 2), "cpu_s": round(cpu, 2), "in_sample": round(ins, 4),
           "gap": round(ins / bound["bound"], 4)}
    row.update({k: v for k, v in bound.items() if k in BOUND_FIELDS or k == "max_imbalance"})
    if bound["best_known"].get(path) is not None:
        row["best_known"] = max(bound["best_known"][path], round(ins, 4))
    if path in bound["in_sample_before"]:
        row["in_sample_before"] = bound["in_sample_before"][path]
    row["bound_reused"] = True
    row.update(_optimal_homes(placement, trace, bound["bound"]))
    row.update(_homes_pass(placement))
    return row


def _homes_pass(placement) -> dict:
    """{homes_swaps, homes_s}: swaps kept and seconds of `sempar-exact-refine`'s pass on the
    optimal-home figure over all layers (placement/refine.py); {} for the other solvers."""
    layers = [r["homes"] for r in placement.info.get("exact", {}).get("layers", [])
              if "homes" in r]
    if not layers:
        return {}
    return {"homes_swaps": sum(r["swaps"] for r in layers),
            "homes_s": round(sum(r["seconds"] for r in layers), 1)}


def rebound(trace_path: Path, ep: int, old: list[dict], bound_config: BoundConfig) -> list[dict]:
    """`old` (rows of one (trace, EP) from an earlier --json run) with the bound recomputed at
    their largest beta (unseeded: the seed changes only the column generation's speed) and the
    ratios in-sample / bound again (the optimal homes' too, where the row has them); LAR, best
    known (kept: still achieved) and solve figures as they were. `bound_colgen_layers`: the
    layers where the column-generation bound is the least."""
    if not old:
        return []
    trace = read_trace(trace_path)
    beta = max(r["max_imbalance"] for r in old)
    c0, t0 = cpu_now(), time.perf_counter()
    bound = lar_upper_bound(trace, ep, bound_config, beta, None)
    bound_s, bound_cpu = time.perf_counter() - t0, cpu_now() - c0
    b = max(bound["lar_mean"], 1e-12)
    out = []
    for r in old:
        row = dict(r, bound=round(bound["lar_mean"], 4), gap=round(r["in_sample"] / b, 4),
                   bound_any_balance=round(bound["lar_mean_any_balance"], 4),
                   bound_method=bound["method"], bound_s=round(bound_s, 1),
                   bound_cpu_s=round(bound_cpu, 1),
                   bound_colgen_layers=sum(m == COLGEN_METHOD for m in bound["per_layer_method"]),
                   bound_per_layer=[round(x, 4) for x in bound["per_layer"]],
                   bound_colgen_budget_s=(None if bound_config.colgen_large is None
                                          else bound_config.colgen_large.budget_s))
        if "in_sample_optimal" in r:
            row["gap_optimal"] = round(r["in_sample_optimal"] / b, 4)
        out.append(row)
    return out


METHODS = {"new": "sempar", "old": "sempar (per-row path)", "hypergraph": "sempar-hypergraph",
           "exact": "sempar-exact", "exact-refine": "sempar-exact-refine"}


def gap_table(rows: list[dict]) -> str:
    """The markdown table of docs/placement.md ("How far from optimal") from this benchmark's
    --json rows: per case and method the in-sample LAR with the default homes (the optimal
    assignment per batch, `capacity.DEFAULT_ASSIGN`: the row's `in_sample_optimal`; blank in
    rows from before it) and its certified ratio (in-sample / bound), the same two with the
    greedy proposal rounds (`in_sample`, `gap`: the default before issue 46) and their best
    known, the bound and its method, beta, CPU seconds of the solve and of the bound, and the
    integer configuration bound's own HiGHS gap (worst layer; blank where it did not run)."""
    names = {"dsv2": "DeepSeek-V2-Lite", "gpt": "GPT-OSS-20B"}
    out = ["| case | method | in-sample LAR | certified ratio | in-sample LAR, greedy homes "
           "| certified ratio, greedy homes | best known, greedy homes | bound (method) "
           "| beta | bound, any balance | solve CPU s | bound CPU s | bound's MILP gap |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        method = " + ".join(m.split(" (")[0] for m in r.get("bound_method", "").split(" + "))
        if r.get("bound_colgen_layers") is not None and "bound_per_layer" in r:
            method += (f"; column generation the least at {r['bound_colgen_layers']} of "
                       f"{len(r['bound_per_layer'])} layers")
        name = METHODS.get(r.get("path", "new"), f"sempar ({r.get('path')})")
        opt = (f"{r['in_sample_optimal']:.4f} | {r['gap_optimal']:.4f}"
               if "in_sample_optimal" in r else " | ")
        out.append(f"| {names.get(r['trace'], r['trace'])} EP {r['ep']} | {name} | {opt} | "
                   f"{r['in_sample']:.4f} | {r['gap']:.3f} | "
                   f"{r.get('best_known', r['in_sample']):.4f} | {r['bound']:.4f} ({method}) | "
                   f"{r.get('max_imbalance', float('nan')):.3f} | "
                   f"{r.get('bound_any_balance', r['bound']):.4f} | {r.get('cpu_s', '')} | "
                   f"{_bound_cost(r)} | {_milp_gap(r)} |")
    return "\n".join(out)


def _milp_gap(r: dict) -> str:
    """The integer configuration bound's worst HiGHS gap over its layers, or blank."""
    if "bound_milp_gap_max" not in r:
        return ""
    return f"{100 * r['bound_milp_gap_max']:.2g} % ({r['bound_milp_layers']} layers)"


def _bound_cost(r: dict) -> str:
    """The bound's CPU seconds, or its wall seconds (marked) in rows from before CPU was kept."""
    if "bound_cpu_s" in r:
        return str(r["bound_cpu_s"])
    return f"{r['bound_s']} (wall)" if "bound_s" in r else ""


def trace_options(ap: argparse.ArgumentParser, cases: list[str], eps: list[int]) -> None:
    """The options naming the cases (shared with bench_home_rules.py): --trace NAME=PATH,
    --cases, --ep and --cache-dir (where the real npz traces are imported)."""
    ap.add_argument("--trace", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--cases", nargs="+", default=cases, choices=list(TRACES))
    ap.add_argument("--ep", nargs="+", type=int, default=eps)
    ap.add_argument("--cache-dir", default=os.environ.get("SEMPAR_BENCH_CACHE",
                                                          "/tmp/sempar-bench-rows"))


def parse_or_table(ap: argparse.ArgumentParser, argv: list[str] | None, table) -> Any:
    """Add --json and --table JSON (shared with bench_home_rules.py) and parse; with --table,
    print `table(rows of that file)` and return None (run nothing), else the parsed args."""
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--table", metavar="JSON",
                    help="print the table of a --json output, run nothing")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return None
    return args


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    trace_options(ap, ["dsv2"], [8, 4])
    ap.add_argument("--paths", nargs="+", default=["new", "old"], choices=list(PATHS))
    ap.add_argument("--held-out", action="store_true")
    ap.add_argument("--bound-parts", type=int, default=None,
                    help="the column-generation bound's caps a layer (runs of tp batches; "
                         "ColgenConfig.parts, default 0: one a batch)")
    ap.add_argument("--milp-time-limit", type=float, default=ConfigIlpConfig.time_limit_s,
                    help="the integer configuration bound's HiGHS limit a layer (seconds); 0: "
                         "leave that bound out (LP bounds only)")
    ap.add_argument("--bound-from", metavar="JSON",
                    help="reuse the bound of each case from a previous --json output (e.g. "
                         "docs/results/optimality-bound.json) instead of computing it "
                         "(--held-out is not run then)")
    ap.add_argument("--bound-only", metavar="JSON",
                    help="solve nothing: take this --json output's rows of the chosen cases and "
                         "EPs (their in-sample LAR, best known and beta) and recompute only the "
                         "bound (unseeded), its ratio and cost")
    ap.add_argument("--colgen-large-budget", type=float, default=None,
                    help="CPU seconds a layer of the column-generation bound where the device "
                         "sets are beyond its exact scan (BoundConfig.colgen_large.budget_s; 0: "
                         "leave it out)")
    args = parse_or_table(ap, argv, gap_table)
    if args is None:
        return
    given = dict(t.split("=", 1) for t in args.trace)
    bound_rows = json.loads(Path(args.bound_from).read_text()) if args.bound_from else None
    bound_config = (BoundConfig() if args.bound_parts is None
                    else BoundConfig(colgen=ColgenConfig(parts=args.bound_parts)))
    if args.colgen_large_budget is not None:
        large = (None if args.colgen_large_budget <= 0 else
                 replace(bound_config.colgen_large, budget_s=args.colgen_large_budget))
        bound_config = replace(bound_config, colgen_large=large)
    rows = []
    for name in args.cases:
        path = ensure_trace(name, given, Path(args.cache_dir))
        for ep in args.ep:
            if args.bound_only:
                old = rows_of(json.loads(Path(args.bound_only).read_text()), name, ep,
                              args.paths)
                for row in rebound(path, ep, old, bound_config):
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                continue
            ilp = (ConfigIlpConfig(time_limit_s=args.milp_time_limit)
                   if args.milp_time_limit > 0 else None)
            for row in cases(name, path, ep, args.paths, args.held_out, bound_config, ilp,
                             bound_rows):
                rows.append(row)
                if not args.json:
                    print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
                else:       # each row as it is made (a loaded machine may not reach the end)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:          # side by side: old / new per (trace, EP)
        for name in args.cases:
            for ep in args.ep:
                by = {r["path"]: r for r in rows_of(rows, name, ep)}
                if {"new", "old"} <= set(by):
                    ratio = by["old"]["solve_s"] / max(by["new"]["solve_s"], 1e-9)
                    print(f"{name} EP {ep}: solve {by['old']['solve_s']} s -> "
                          f"{by['new']['solve_s']} s (x{ratio:.1f}), "
                          f"CPU {by['old']['cpu_s']} s -> {by['new']['cpu_s']} s, in-sample "
                          f"{by['old']['in_sample']} -> {by['new']['in_sample']} "
                          f"(bound {by['new']['bound']})")


if __name__ == "__main__":
    main()
