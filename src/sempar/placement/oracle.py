"""`oracle`: the ceiling of docs/design.md, not a deployable method (for reports only).

The oracle knows the routing it is judged on. `sempar evaluate` solves it on the *eval* trace
(in-sample, so never compare it as a method: it is the roof the others are measured against)
and places every (token, layer) knowing its real routing under the mode's capacity rule
(docs/design.md "Oracle LAR": equal tokens per device per batch in tp mode, whole requests per DP rank
in dp mode). Its `lar_mean` therefore equals its `oracle_lar_mean`.

The placement itself is METIS's co-clustering of the token-expert co-activation graph (s-MoE
§5.7's baseline; `graph_baselines.metis`) fitted on the trace it is given — ours: among our
solvers it has the highest unconstrained oracle LAR on the tiny-moe64 dev trace (0.54 against
semmoe's 0.46 at EP 4), which is the property a ceiling needs. Given a fit trace (`sempar place
--method oracle`), it is just METIS in-sample, labelled as not deployable.
"""

from __future__ import annotations

from sempar.placement.base import SOLVERS, PlacementProblem
from sempar.placement.graph_baselines import metis
from sempar.placement.placement import Placement

ORACLE = "oracle"


@SOLVERS.register(ORACLE, replicas=False, preserves_groups=False, mode_aware=False)
def oracle(p: PlacementProblem) -> Placement:
    """METIS co-clustering of the trace it is given; `info["deployable"] = False`."""
    placement = metis(p)
    placement.info.update(deployable=False, in_sample=True,
                          note="ceiling: solved on the data it is judged on, homes from real routing")
    return placement
