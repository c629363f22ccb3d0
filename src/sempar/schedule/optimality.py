"""How far from optimal: `evaluate`'s "bound" ref rows (tp mode).

Beside the ceilings any solved placement reached (`evaluate.ceiling_refs`), rows on the FIT
sample: an upper bound on the capacity-bound exact-home LAR of any placement
(`placement.bound.lar_upper_bound`: the device-configuration LP where it can enumerate the device
sets, else the pair budget), `sempar`'s own capacity-bound exact-home LAR there (in-sample: the
figure the bound bounds) with their ratio, the optimality gap, in the bound's row ("gap":
in-sample / bound; 1.0 would prove `sempar` optimal on the fit sample), and the best placement
known: per layer the better of `sempar`'s and the LP's rounded partition (`best_known`, where the
LP ran), so the gap splits into the solver's part (best_known / sempar) and the bound's
(bound / best_known).

The balance: sempar is held to a load cap, an unbalanced placement is not a rival, so the
configuration LP bounds the placements whose fit-sample load imbalance (max / mean device load,
every layer) is at most beta = the larger of the solve's `max_imbalance` and sempar's own worst
layer (so sempar's placement is always one of them); the row carries beta ("max_imbalance") and
the bound over every placement ("bound_any_balance").
"""

from __future__ import annotations

import numpy as np

from sempar.placement.bound import lar_upper_bound
from sempar.placement.capacity import DEFAULT_ASSIGN
from sempar.placement.device_bound import BoundConfig
from sempar.placement.metrics import placement_figures
from sempar.placement.placement import Placement
from sempar.schedule.homes import oracle_home
from sempar.trace.schema import RoutingTrace

BOUND_REF = "ref: upper bound (configuration LP / pair budget), any placement (fit sample)"
IN_SAMPLE_REF = "ref: sempar in-sample (fit sample)"


def in_sample(placement: Placement, experts: np.ndarray, rule: str = DEFAULT_ASSIGN
              ) -> tuple[np.ndarray, np.ndarray]:
    """(float64[L] `placement`'s capacity-bound exact-home LAR per layer on experts int[T, L, k]
    (the fit sample's), homes by `rule` (`capacity.ASSIGN_RULES`: the "optimal" assignment, the
    default, or "proposal" rounds), float64[L] its load imbalance max / mean per layer there)."""
    f = placement_figures(placement, experts, oracle_home(placement, experts, rule=rule))
    load = f["load"]
    return (np.asarray(f["lar"], np.float64),
            load.max(axis=1) / np.maximum(load.mean(axis=1), 1e-12))


def in_sample_lar(placement: Placement, fit: RoutingTrace) -> np.ndarray:
    """float64[L]: `placement`'s capacity-bound exact-home LAR per layer on `fit`."""
    return in_sample(placement, fit.experts)[0]


def best_known(ours: np.ndarray, fit: RoutingTrace, ep: int, witness: list,
               max_imbalance: float | None = None, rule: str = DEFAULT_ASSIGN) -> np.ndarray:
    """float64[L]: per layer the better of `ours` (sempar's per-layer in-sample LAR) and the
    LP's rounded placement's (`witness[l]` int64[N] experts in device order, or None), the
    latter only where its imbalance is at most `max_imbalance` (None: any); homes by `rule`, as
    `in_sample`'s."""
    out = np.array(ours, np.float64)
    layers = [l for l, w in enumerate(witness) if w is not None]
    if layers:
        pl = Placement(np.stack([witness[l] for l in layers]), fit.meta.num_experts, ep)
        lar, imb = in_sample(pl, fit.experts[:, layers], rule)
        ok = np.ones(len(layers), bool) if max_imbalance is None else \
            imb <= max_imbalance * (1 + 1e-12)
        idx = np.asarray(layers)[ok]
        out[idx] = np.maximum(out[idx], lar[ok])
    return out


def optimality_refs(fit: RoutingTrace, ep: int, placement: Placement | None,
                    max_imbalance: float | None = None, config: BoundConfig = BoundConfig(),
                    bound: dict | None = None, rule: str = DEFAULT_ASSIGN) -> dict:
    """{label: ref row} of the bound on `fit` at EP `ep` and, when `placement` (sempar's, tp)
    is given, its in-sample capacity-bound exact-home LAR, the gap and the best known figure.
    max_imbalance: the solve's load cap (beta is the larger of it and sempar's worst layer;
    None with no placement: the bound over every placement); bound: `lar_upper_bound`'s answer
    computed already for this fit, EP and beta (a benchmark comparing solvers at one beta
    computes it once), else computed here, seeded with the placement; rule: the in-sample
    figures' home rule (`in_sample`; the bound holds for any)."""
    if fit.meta.num_experts % ep:           # the bound assumes N / G slots a device
        return {}
    ours = imb = None
    beta = max_imbalance
    if placement is not None:
        ours, imb = in_sample(placement, fit.experts, rule)
        beta = max(float(imb.max()), max_imbalance or 0.0)
    start = None
    if placement is not None and placement.phy2log.shape[1] == fit.meta.num_experts:
        start = placement.phy2log.astype(np.int64)          # no replicas: a partition a layer
    b = bound if bound is not None else lar_upper_bound(fit, ep, config, beta, start)
    row = {"lar_mean": b["lar_mean"], "placement": "any", "bound": b["method"],
           "max_imbalance": beta, "bound_seconds": float(sum(b.get("seconds", [])))}
    if beta is not None:
        row["bound_any_balance"] = b["lar_mean_any_balance"]
    refs = {BOUND_REF: row}
    if placement is not None:
        row["sempar_in_sample"] = float(ours.mean())
        row["gap"] = row["sempar_in_sample"] / max(b["lar_mean"], 1e-12)
        if any(w is not None for w in b["witness"]):
            row["best_known_in_sample"] = float(best_known(ours, fit, ep, b["witness"],
                                                           beta, rule).mean())
        refs[IN_SAMPLE_REF] = {"lar_mean": row["sempar_in_sample"], "placement": placement.method}
    return refs
