"""Held-out balance for the `rows` objective: the fit load cap lowered by the drift that
cross-validation on the fit requests predicts.

The balance cap holds on fit loads; on routing of new requests a placement's device loads drift,
the more so the more its devices group experts that the same requests use (which locality asks
for) and the fewer the fit requests (DeepSeek-V2-Lite's 35 fit requests from three tasks: fit
1.065 -> held out 1.13 at EP 8). `LoadModel` charges the spread a grouping adds under request
resampling beyond a random grouping's, which does not cover the selection bias of a placement
fitted to the same sample. So (ours; not in the papers):

1. split the fit rows in two halves by whole requests (seeded), solve on half A at the fit cap
   and measure the imbalance (exact pre-routed homes) on A and on B: drift = max(0, B - A);
2. solve on all fit rows at cap min(max_imbalance, target - drift) (at least 1.0), where target
   is the held-out imbalance the placement should stay within (`HeldOut.target`);
3. if the result's own fit imbalance plus drift is still above target, lower the cap by the
   excess and solve once more (`HeldOut.retries`).

The half-size fold overstates the drift of the full fit (its loads are estimated from half the
requests), which errs on the side of balance. Cost: one half-size solve and one or two full
solves; only the rows objective uses it, where homes come from exact pre-routing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sempar.placement.base import PlacementProblem
from sempar.placement.capacity import BATCH
from sempar.placement.placement import Placement
from sempar.placement.sempar.row_replicas import fit_score
from sempar.trace.schema import RoutingTrace


@dataclass(frozen=True, kw_only=True)
class HeldOut:
    """How `calibrated_solve` aims at a held-out imbalance."""

    target: float = 1.10     # held-out imbalance (max/mean, mean over layers) to stay within
    retries: int = 1         # full solves after the first that lower the cap further
    min_requests: int = 4    # fit requests needed to split in two folds (else no calibration)


def exact_imbalance(placement: Placement, trace: RoutingTrace) -> float:
    """Mean over layers of max/mean device load with homes from exact pre-routing (the
    evaluator's `imbalance_max_mean` under `oracle_home`)."""
    hosts = placement.hosts()
    return float(np.mean([fit_score(hosts[l], np.asarray(trace.experts[:, l], np.int64),
                                    placement.node_of, BATCH)[1]
                          for l in range(placement.num_layers)]))


def fold_drift(p: PlacementProblem, solve: Callable[[PlacementProblem], Placement],
               rows: RoutingTrace, min_requests: int) -> float | None:
    """max(0, imbalance on fold B - imbalance on fold A) of a placement solved on fold A (half
    the fit requests, seeded); None when there are too few requests."""
    reqs = np.unique(rows.request_id)
    if reqs.size < min_requests:
        return None
    half = np.random.default_rng(p.seed).permutation(reqs)[: reqs.size // 2]
    in_a = np.isin(rows.request_id, half)
    fold_a, fold_b = rows.take(in_a), rows.take(~in_a)
    pa = solve(dataclasses.replace(p, trace=fold_a))
    return max(0.0, exact_imbalance(pa, fold_b) - exact_imbalance(pa, fold_a))


def calibrated_solve(p: PlacementProblem, solve: Callable[[PlacementProblem], Placement],
                     held_out: HeldOut = HeldOut()) -> Placement:
    """`solve(p)` with the fit cap lowered as the module docstring says; p.trace: the row
    trace (rows.py). The placement's info records the drift and the cap used."""
    drift = fold_drift(p, solve, p.trace, held_out.min_requests)
    if drift is None:
        return solve(p)
    cap = max(1.0, min(p.max_imbalance, held_out.target - drift))
    out = solve(dataclasses.replace(p, max_imbalance=cap))
    for _ in range(held_out.retries):
        excess = exact_imbalance(out, p.trace) + drift - held_out.target
        if excess <= 0 or cap <= 1.0:
            break
        cap = max(1.0, cap - excess)
        out = solve(dataclasses.replace(p, max_imbalance=cap))
    out.info["held_out"] = {"target": held_out.target, "fold_drift": round(drift, 4),
                            "fit_cap": round(cap, 4)}
    return out
