"""Benchmark: placement quality on held-out routing (issue 4), every registered method side by side.

For each trace (the committed dev traces, and a synthetic preset), fit on 20% of the requests,
evaluate on the other 80%, for each cluster shape (`4`, `8`, `2x4` = 2 nodes x 4 devices) and
mode; every placement is solved once and judged in both modes (a mode-aware solver, `sempar`,
once per mode). Prints LAR, its ratio to vanilla, the capacity-bound oracle LAR of the same
placement and the LAR as a share of it, the unconstrained oracle, node-local rate, imbalance and
solve time, the `ref:` ceilings (evaluate.ceiling_refs), then a verdict per case. Targets (issue
15): `sempar` has the highest LAR of the deployable methods (every method but `oracle`) with
imbalance <= 1.10, by a margin (>= MARGIN LAR over the next), and on tiny-moe64 in tp mode LAR
>= 0.40 at EP 4 and >= 0.25 at EP 8 with imbalance <= 1.10. With --replicas, sempar and eplb at
R = G (one extra slot per device, same memory) on the dev traces: target sempar >= 1.15x eplb's
LAR with imbalance <= 1.05. Where ours loses, the verdict names the winner. It asserts nothing.

    python benchmarks/bench_placement.py [--shapes 4 8 2x4] [--modes tp dp] [--replicas]
                                         [--synth olmoe-1b-7b:100000] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import asdict

import numpy as np

from sempar.paths import dev_trace_paths
from sempar.placement import SOLVERS
from sempar.placement.sempar import SemparConfig
from sempar.schedule.evaluate import evaluate_modes
from sempar.trace import read_trace, split_by_request
from sempar.trace.synth import synthesize

OURS = "sempar"
BALANCE = 1.10
MARGIN = 0.005          # LAR by which ours must lead the next method within the balance budget
LAR_TARGETS = {("tiny-moe64", 4): 0.40, ("tiny-moe64", 8): 0.25}     # tp mode, one node
REPLICA_RATIO, REPLICA_BALANCE = 1.15, 1.05
FLOOR_SLACK = 1.02      # x the balance floor: the budget of a case where BALANCE is unreachable
FLOOR_GROUPINGS = 20_000  # equal-slot groupings searched per layer at most (else no floor)


def _groupings(experts: tuple, size: int):
    """Every split of `experts` into groups of `size` (unordered groups)."""
    if not experts:
        yield ()
        return
    first, rest = experts[0], experts[1:]
    for mates in itertools.combinations(rest, size - 1):
        left = tuple(e for e in rest if e not in mates)
        for tail in _groupings(left, size):
            yield ((first, *mates),) + tail


def balance_floor(ev, G: int) -> float | None:
    """The lowest imbalance (mean over layers of max/mean device load, metrics.placement_figures)
    any placement without replicas reaches on the held-out loads of `ev`: per layer, the best of
    every split of the N experts into G groups of N / G; None when there are more than
    FLOOR_GROUPINGS splits (N! / ((N/G)!^G G!): 105 for 8 experts on 4 devices, 3.8e5 for 16
    on 4)."""
    N, L = ev.meta.num_experts, ev.meta.num_layers
    S = N // G
    if N % G:
        return None
    count = math.factorial(N) // (math.factorial(S) ** G * math.factorial(G))
    if count > FLOOR_GROUPINGS:
        return None
    splits = [list(g) for g in _groupings(tuple(range(N)), S)]
    best = []
    for l in range(L):
        load = np.bincount(np.asarray(ev.experts[:, l], np.int64).ravel(), minlength=N)
        dev = np.array([[load[list(g)].sum() for g in split] for split in splits], float)
        best.append(float((dev.max(axis=1) / dev.mean(axis=1)).min()))
    return float(np.mean(best))


def _best_within(deploy: dict, budget: float, label: str) -> list[str]:
    """The best-within-budget line and ours' target line for one imbalance budget."""
    balanced = {k: v for k, v in deploy.items() if v["imbalance_max_mean"] <= budget}
    ranked = sorted(balanced, key=lambda k: -balanced[k]["lar_mean"])
    out = [f"best with imbalance <= {label}: " + (", ".join(
        f"{k} {balanced[k]['lar_mean']:.3f}" for k in ranked[:3]) or "none (no method is "
        "within the imbalance budget)")]
    if OURS not in deploy:
        return out
    ours = deploy[OURS]
    rivals = [k for k in ranked if k != OURS]
    head = f"target '{OURS} best within {label} by >= {MARGIN}': "
    mine = f"{OURS} {ours['lar_mean']:.3f} (imbalance {ours['imbalance_max_mean']:.3f})"
    if not ranked:
        out.append(head + f"MISSED: no method is within the imbalance budget; {mine}")
    elif OURS not in balanced:
        out.append(head + f"MISSED: {mine} is outside the imbalance budget; best within it "
                          f"{ranked[0]} {balanced[ranked[0]]['lar_mean']:.3f}")
    else:
        lead = ours["lar_mean"] - (balanced[rivals[0]]["lar_mean"] if rivals else 0.0)
        ok = ranked[0] == OURS and lead >= MARGIN
        out.append(head + (f"MET (lead {lead:+.3f}" + ("" if rivals else
                                                       ", no other method within") + ")"
                           if ok else f"MISSED: {mine}, lead {lead:+.3f} over {rivals[0]}"))
    return out


def verdict(res: dict, trace: str, floor: float | None = None) -> list[str]:
    m = res["methods"]
    deploy = {k: v for k, v in m.items() if k != "oracle"}
    out = _best_within(deploy, BALANCE, f"{BALANCE}")
    if floor is not None and floor * FLOOR_SLACK > BALANCE:
        budget = floor * FLOOR_SLACK
        out.append(f"balance floor {floor:.3f} (best equal-slot split of the held-out loads): "
                   f"{BALANCE} is unreachable; restated budget {FLOOR_SLACK} x floor = {budget:.3f}")
        out += _best_within(deploy, budget, f"{budget:.3f}")
    if OURS in deploy:
        ours = deploy[OURS]
        goal = LAR_TARGETS.get((trace, res["ep"]))
        if goal and res["mode"] == "tp" and res["nodes"] == 1:
            hit = ours["lar_mean"] >= goal and ours["imbalance_max_mean"] <= BALANCE
            out.append(f"target 'LAR >= {goal} with imbalance <= {BALANCE}': "
                       f"{'MET' if hit else 'MISSED'} ({ours['lar_mean']:.3f}, "
                       f"{ours['imbalance_max_mean']:.3f}; {ours['share_of_oracle']:.0%} of its "
                       f"capacity-bound oracle)")
    return out


def print_case(name: str, shape: str, res: dict, ev_tokens: int, lines: list[str]) -> None:
    base = res["methods"].get("vanilla", {}).get("lar_mean")
    print(f"\n{name}: EP {res['ep']} ({shape}), {res['mode']} mode, R {res['redundant']}, "
          f"{ev_tokens} held-out tokens")
    print(f"{'method':<12} {'LAR':>6} {'xvanilla':>8} {'oracle':>7} {'share':>6} {'free':>6} "
          f"{'node-loc':>8} {'max/mean':>8} {'copies':>7} {'solve s':>8}")
    for m, r in sorted(res["methods"].items(), key=lambda kv: -kv[1]["lar_mean"]):
        ratio = r["lar_mean"] / base if base else float("nan")
        print(f"{m:<12} {r['lar_mean']:6.3f} {ratio:8.2f} {r['oracle_lar_mean']:7.3f} "
              f"{r['share_of_oracle']:6.2f} {r['oracle_lar_unconstrained_mean']:6.3f} "
              f"{r['node_local_rate']:8.3f} {r['imbalance_max_mean']:8.3f} "
              f"{r['remote_copies_per_token']:7.2f} {r['solve_seconds']:8.2f}")
    for label, r in res.get("refs", {}).items():
        print(f"  {label}: {r['lar_mean']:.3f} ({r['placement']})")
    for line in lines:
        print("  " + line)


def replica_verdict(res: dict) -> list[str]:
    m = res["methods"]
    if "sempar" not in m or "eplb" not in m:
        return []
    s, e = m["sempar"], m["eplb"]
    ratio = s["lar_mean"] / max(e["lar_mean"], 1e-12)
    ok = ratio >= REPLICA_RATIO and s["imbalance_max_mean"] <= REPLICA_BALANCE
    return [f"target 'sempar >= {REPLICA_RATIO}x eplb at R = G, imbalance <= {REPLICA_BALANCE}': "
            f"{'MET' if ok else 'MISSED'} ({ratio:.2f}x, imbalance "
            f"{s['imbalance_max_mean']:.3f} vs eplb {e['imbalance_max_mean']:.3f})"]


def sempar_config(fit, ep: int) -> dict:
    """The settings `sempar` solves `fit` at EP `ep` with (solving by name), for the record."""
    meta = fit.meta
    return asdict(SemparConfig.for_shape(fit.num_tokens, meta.num_layers, meta.num_experts, ep))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4", "8", "2x4"], help="G or NODESxPER_NODE")
    ap.add_argument("--modes", nargs="+", default=["tp", "dp"])
    ap.add_argument("--synth", default="olmoe-1b-7b:100000", help="PRESET:TOKENS, or '' for none")
    ap.add_argument("--methods", default=",".join(SOLVERS.names()))
    ap.add_argument("--replicas", action="store_true", help="also sempar vs eplb at R = G")
    ap.add_argument("--traces", nargs="*", default=None, help="dev trace names (default: all)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    traces = {p.stem: read_trace(p) for p in dev_trace_paths()
              if args.traces is None or p.stem in args.traces}
    if args.synth:
        preset, n = args.synth.split(":")
        traces[f"synthetic {preset}"] = synthesize(preset, int(n), seed=1)
    methods = args.methods.split(",")
    report = []
    for name, trace in traces.items():
        fit, ev = split_by_request(trace, seed=0)
        for shape in args.shapes:
            nodes, per = (int(x) for x in shape.split("x")) if "x" in shape else (1, int(shape))
            ep = nodes * per
            if ep > trace.meta.num_experts:
                continue
            print(f"{name}: {shape} ...", file=sys.stderr)
            both = evaluate_modes(fit, ev, ep, nodes, methods, tuple(args.modes))
            floor = balance_floor(ev, ep)
            cases = [(dict(res, balance_floor=floor), verdict(res, name, floor))
                     for res in both.values()]
            if args.replicas and not name.startswith("synthetic") and nodes == 1:
                rep = evaluate_modes(fit, ev, ep, nodes, ["eplb", "sempar"], tuple(args.modes),
                                     redundant=ep)
                cases += [(res, replica_verdict(res)) for res in rep.values()]
            config = sempar_config(fit, ep) if OURS in methods or args.replicas else None
            for res, lines in cases:
                report.append({"trace": name, "shape": shape, **res, "verdict": lines,
                               "sempar_config": config})
                if not args.json:
                    print_case(name, shape, res, ev.num_tokens, lines)
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
