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
"""

from __future__ import annotations

import numpy as np

from sempar.placement.bound import lar_upper_bound
from sempar.placement.device_bound import BoundConfig
from sempar.placement.metrics import placement_figures
from sempar.placement.placement import Placement
from sempar.schedule.homes import oracle_home
from sempar.trace.schema import RoutingTrace

BOUND_REF = "ref: upper bound (configuration LP / pair budget), any placement (fit sample)"
IN_SAMPLE_REF = "ref: sempar in-sample (fit sample)"


def in_sample_lar(placement: Placement, fit: RoutingTrace) -> np.ndarray:
    """float64[L]: `placement`'s capacity-bound exact-home LAR per layer on `fit`."""
    return np.asarray(placement_figures(placement, fit.experts,
                                        oracle_home(placement, fit.experts))["lar"], np.float64)


def best_known(ours: np.ndarray, fit: RoutingTrace, ep: int, witness: list) -> np.ndarray:
    """float64[L]: per layer the better of `ours` (sempar's per-layer in-sample LAR) and the
    LP's rounded placement's (`witness[l]` int64[N] experts in device order, or None)."""
    out = np.array(ours, np.float64)
    layers = [l for l, w in enumerate(witness) if w is not None]
    if layers:
        pl = Placement(np.stack([witness[l] for l in layers]), fit.meta.num_experts, ep)
        lp = placement_figures(pl, fit.experts[:, layers],
                               oracle_home(pl, fit.experts[:, layers]))["lar"]
        out[layers] = np.maximum(out[layers], np.asarray(lp, np.float64))
    return out


def optimality_refs(fit: RoutingTrace, ep: int, placement: Placement | None,
                    config: BoundConfig = BoundConfig()) -> dict:
    """{label: ref row} of the bound on `fit` at EP `ep` and, when `placement` (sempar's, tp)
    is given, its in-sample capacity-bound exact-home LAR, the gap and the best known figure."""
    if fit.meta.num_experts % ep:           # the bound assumes N / G slots a device
        return {}
    b = lar_upper_bound(fit, ep, config)
    row = {"lar_mean": b["lar_mean"], "placement": "any", "bound": b["method"]}
    refs = {BOUND_REF: row}
    if placement is not None:
        ours = in_sample_lar(placement, fit)
        row["sempar_in_sample"] = float(ours.mean())
        row["gap"] = row["sempar_in_sample"] / max(b["lar_mean"], 1e-12)
        if any(w is not None for w in b["witness"]):
            row["best_known_in_sample"] = float(best_known(ours, fit, ep, b["witness"]).mean())
        refs[IN_SAMPLE_REF] = {"lar_mean": row["sempar_in_sample"], "placement": placement.method}
    return refs
