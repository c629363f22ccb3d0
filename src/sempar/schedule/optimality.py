"""How far from optimal: `evaluate`'s "bound" ref rows (tp mode).

Beside the ceilings any solved placement reached (`evaluate.ceiling_refs`), two rows on the FIT
sample: an upper bound on the capacity-bound exact-home LAR of any placement
(`placement.bound.lar_upper_bound`) and `sempar`'s own capacity-bound exact-home LAR there
(in-sample: the figure the bound bounds), with their ratio, the optimality gap, in the bound's
row ("gap": in-sample / bound; 1.0 would prove `sempar` optimal on the fit sample).
"""

from __future__ import annotations

from sempar.placement.bound import lar_upper_bound
from sempar.placement.metrics import placement_figures
from sempar.placement.placement import Placement
from sempar.schedule.homes import oracle_home
from sempar.trace.schema import RoutingTrace

BOUND_REF = "ref: upper bound, any placement (fit sample)"
IN_SAMPLE_REF = "ref: sempar in-sample (fit sample)"


def optimality_refs(fit: RoutingTrace, ep: int, placement: Placement | None) -> dict:
    """{label: ref row} of the bound on `fit` at EP `ep` and, when `placement` (sempar's, tp)
    is given, its in-sample capacity-bound exact-home LAR and the gap."""
    if fit.meta.num_experts % ep:           # the bound assumes N / G slots a device
        return {}
    b = lar_upper_bound(fit, ep)
    row = {"lar_mean": b["lar_mean"], "placement": "any", "bound": b["method"]}
    refs = {BOUND_REF: row}
    if placement is not None:
        ins = placement_figures(placement, fit.experts, oracle_home(placement, fit.experts))
        row["sempar_in_sample"] = ins["lar_mean"]
        row["gap"] = ins["lar_mean"] / max(b["lar_mean"], 1e-12)
        refs[IN_SAMPLE_REF] = {"lar_mean": ins["lar_mean"], "placement": placement.method}
    return refs
