"""`moetuner` placement: MoETuner (Go & Mahajan 2025, as summarised by Sem-MoE §2 / §4.3), solved
with the affinity-chain ILP machinery of `placement/ilp.py` (HiGHS via `scipy.optimize.milp`).

The ILP (ours from Sem-MoE's description: "an Integer Linear Programming (ILP) formulation
that leverages predictable token routing dependencies across layers. It jointly optimizes
expert-to-GPU assignments to balance computational workloads and minimize communication costs";
"imbalanced token processing loads across GPUs and skewed inter-GPU communication, which lead to
significant tail latency"). Same x, eqs. 9-10 at GPU level (equal experts per GPU), loads
w_l[e] = activations of expert e at layer l in the fit trace, z_l >= sum_e w_l[e] x[l, e, g]
for every g (z_l = the layer's max GPU load, the tail), and the same y for kept traffic:

    minimise  sum_l  lam * z_l / mean_l  +  sum_l (C_l.sum() - sum_{i,j,g} C_l[i,j] y[l,i,j,g]) / C_l.sum()

with mean_l = sum_e w_l[e] / G: the max/mean imbalance of each layer plus the cross-GPU share of
each layer pair, weighted by `lam` (default 2). Nodes are not staged (GPU level only).
"""

from __future__ import annotations

import time

import numpy as np

from sempar.placement.base import SOLVERS, PlacementProblem
from sempar.placement.ilp import (MAX_PAIR_VARS, TIME_LIMIT, WINDOW, affinity_counts,
                                  chain_status, gpu_placement, kept_affinity, solve_chain)
from sempar.placement.placement import Placement

LAMBDA = 2.0             # weight of the max/mean load term


@SOLVERS.register("moetuner", replicas=False, preserves_groups=False, mode_aware=False)
def moetuner(p: PlacementProblem, time_limit: float = TIME_LIMIT, lam: float = LAMBDA,
             pairs: str = "all", max_pair_vars: int = MAX_PAIR_VARS,
             window: int | None = WINDOW) -> Placement:
    """Joint load-balance + inter-layer traffic ILP (MoETuner); see the module docstring."""
    t = p.trace
    N, G = t.meta.num_experts, p.num_devices
    t0 = time.perf_counter()
    C = affinity_counts(t.experts, N, pairs)
    load = p.expert_load()
    ilps: list = []
    gpu = solve_chain(C, G, N // G, time_limit, ilps, load=load, lam=lam,
                       max_pair_vars=max_pair_vars, window=window, tag="gpus")
    kept = kept_affinity(gpu, C)
    gl = np.stack([np.bincount(gpu[l], weights=load[l], minlength=G) for l in range(gpu.shape[0])])
    info = {"solver": "scipy.optimize.milp (HiGHS)", "time_limit": time_limit, "lambda": lam,
            "pairs": pairs, "status": chain_status(ilps), "objective_kept_pairs": kept,
            "inter_layer_locality": kept / max(C.sum(), 1.0),
            "fit_imbalance_max_mean": float((gl.max(axis=1) / gl.mean(axis=1)).mean()),
            "mip_gap_max": max((i["mip_gap"] for i in ilps if i["mip_gap"] is not None),
                               default=None),
            "seconds": round(time.perf_counter() - t0, 3), "ilps": ilps}
    return gpu_placement(gpu, p, info)
