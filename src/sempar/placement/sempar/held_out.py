"""Held-out balance for the `rows` objective: the fit load cap lowered until a request
bootstrap predicts the placement stays within a held-out imbalance.

The balance cap holds on fit loads; on routing of new requests a placement's device loads drift,
the more so the more its devices group experts that the same requests use (which locality asks
for) and the fewer the fit requests. `LoadModel` charges the spread a grouping adds under
request resampling beyond a random grouping's; it does not say what the placement's imbalance
will be on new requests. So (ours; not in the papers):

1. solve at the fit cap (`max_imbalance`);
2. predict the held-out imbalance (`predicted_imbalance`): the fit rows homed by exact
   pre-routing (`capacity_home`, per batch) and served by the serving rule give each fit
   request's load on each device per layer, X [R, L, G]. Held-out loads differ from the fit
   loads by the fit sample's deviation from the population plus the new sample's own; a
   request bootstrap draws each (a resample of R requests spreads around the fit loads as the
   fit loads spread around the population's), so a replicate's request weights are
   w1 + w2 - 1 with w1, w2 two independent resamples, i.e. a new sample as large as the fit
   sample (`HeldOut.replicates` replicates, seeded); the mean over replicates of their
   imbalance (mean over layers of max / mean) is the prediction;
3. while the prediction is above `HeldOut.target`, lower the cap by the excess and solve again
   (at most `HeldOut.retries` times, never below 1.0).

A single resample (the fit sample's deviation only) predicted low where few fit requests make
the fit loads a poor sample (figures: docs/results/placement-real.md and the commit messages).
Cost: a bootstrap of R x L x G sums, and a re-solve only where the prediction is above target.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sempar.placement import serving
from sempar.placement.base import PlacementProblem
from sempar.placement.capacity import BATCH, capacity_home
from sempar.placement.placement import Placement
from sempar.trace.schema import RoutingTrace


@dataclass(frozen=True, kw_only=True)
class HeldOut:
    """How `calibrated_solve` aims at a held-out imbalance."""

    target: float = 1.10     # held-out imbalance (max/mean, mean over layers) to stay within
    retries: int = 3         # solves after the first that lower the cap further
    replicates: int = 50     # request bootstrap replicates of the prediction
    seed: int = 0


def request_loads(placement: Placement, trace: RoutingTrace, batch: int = BATCH) -> np.ndarray:
    """float64[R, L, G]: activations each request of `trace` puts on each device per layer,
    homes by exact pre-routing (`capacity_home`), served by the serving rule."""
    reqs, ridx = np.unique(trace.request_id, return_inverse=True)
    L, G = placement.num_layers, placement.num_devices
    hosts = placement.hosts()
    order = serving.node_order(placement.node_of)
    out = np.zeros((reqs.size, L, G))
    for l in range(L):
        ex = np.asarray(trace.experts[:, l], np.int64)                 # [T, k]
        home = capacity_home(hosts[l][:, ex].sum(axis=2).T, batch)
        dev = serving.serve(serving.table(hosts[l], order), home, ex)  # [T, k]
        np.add.at(out[:, l], (np.repeat(ridx, ex.shape[1]), dev.ravel()), 1.0)
    return out


def imbalance(load: np.ndarray) -> float:
    """Mean over layers of max / mean device load; load float[L, G]."""
    return float((load.max(axis=1) / np.maximum(load.mean(axis=1), 1e-12)).mean())


def predicted_imbalance(placement: Placement, trace: RoutingTrace,
                        held_out: HeldOut = HeldOut()) -> float:
    """The request bootstrap's mean imbalance of `placement` on a new sample as large as the
    fit sample (module docstring, step 2)."""
    X = request_loads(placement, trace)
    R = X.shape[0]
    rng = np.random.default_rng(held_out.seed)
    draw = lambda: rng.multinomial(R, np.full(R, 1.0 / R), size=held_out.replicates)  # noqa: E731
    w = (draw() + draw() - 1).astype(np.float64)
    return float(np.mean([imbalance(np.maximum(np.einsum("r,rlg->lg", wi, X), 0.0))
                          for wi in w]))


def calibrated_solve(p: PlacementProblem, solve: Callable[[PlacementProblem], Placement],
                     held_out: HeldOut = HeldOut()) -> Placement:
    """`solve(p)` with the fit cap lowered as the module docstring says; p.trace: the row
    trace (rows.py). The placement's info records the prediction and the cap used."""
    cap = p.max_imbalance
    out = solve(p)
    pred = predicted_imbalance(out, p.trace, held_out)
    for _ in range(held_out.retries):
        if pred <= held_out.target or cap <= 1.0:
            break
        cap = max(1.0, cap - (pred - held_out.target))
        out = solve(dataclasses.replace(p, max_imbalance=cap))
        pred = predicted_imbalance(out, p.trace, held_out)
    out.info["held_out"] = {"target": held_out.target, "predicted_imbalance": round(pred, 4),
                            "fit_cap": round(cap, 4)}
    return out
