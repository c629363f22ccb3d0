"""`eplb`: load balancing with redundant experts, as DeepSeek's EPLB describes it.

Written from the public description of deepseek-ai/EPLB (no code taken): three small steps,
composed hierarchically (expert groups -> nodes -> GPUs) when the number of expert groups is a
multiple of the number of nodes, else globally (one group, one node):

1. `balanced_packing`: pack the expert groups onto nodes so that node loads are even
   (heaviest group first, onto the least-loaded node that still has room);
2. `replicate_experts`: inside each node, give the extra physical slots to the experts with the
   highest load per replica, one slot at a time;
3. `balanced_packing` again: pack the node's physical experts (load = expert load / replicas)
   onto its GPUs, equal slot counts per GPU.

Inputs and outputs follow EPLB's: `weight[L, E]` (load per logical expert), `num_replicas` (physical
experts per layer), `num_groups`, `num_nodes`, `num_gpus` -> `phy2log[L, R]`, `log2phy[L, E, maxcnt]`
(padded with -1) and `logcnt[L, E]`. One choice of ours: when packing physical experts onto
GPUs, a GPU never takes two replicas of the same expert (a second copy on the same GPU serves
no token locally that the first would not) unless every GPU of the node with room holds one.
Checked against DeepSeek's code (deepseek-ai/EPLB eplb.py, commit d52c72d; issue 34): its step 3
packs by load alone, so it puts two copies on one GPU more often (6-24 (layer, GPU) pairs a case
on the real DeepSeek-V2-Lite / GPT-OSS-20B loads at EP 4 / 8, 1 or 2 nodes; ours 0 there), and
both must when an expert has more copies than its node has GPUs (`--nodes 2 --redundant G`: G / 2
GPUs and G / 2 extra slots a node, replicas kept in the node): faithful, not a bug
(tests/placement/test_eplb_copies.py).
"""

from __future__ import annotations

import numpy as np

from sempar.errors import InputError
from sempar.placement.base import SOLVERS, PlacementProblem
from sempar.placement.placement import Placement


def balanced_packing(weight: np.ndarray, num_packs: int,
                     label: np.ndarray | None = None) -> np.ndarray:
    """int64[n]: pack index of each item; every pack gets n / num_packs items.

    weight: float[n]. Items go heaviest first to the lightest pack with room (and, when
    `label` int[n] is given, with no item of the same label yet).
    """
    n = weight.size
    per_pack = n // num_packs
    pack = np.full(n, -1, np.int64)
    load = np.zeros(num_packs)
    count = np.zeros(num_packs, np.int64)
    members: list[set] = [set() for _ in range(num_packs)]
    for i in np.argsort(-weight, kind="stable"):
        ok = count < per_pack
        if label is not None:
            ok &= np.array([label[i] not in m for m in members])
            if not ok.any():  # only a pack that already holds this label has room
                ok = count < per_pack
        choice = int(np.flatnonzero(ok)[np.argmin(load[ok])])
        pack[i] = choice
        load[choice] += weight[i]
        count[choice] += 1
        if label is not None:
            members[choice].add(int(label[i]))
    return pack


def replicate_experts(weight: np.ndarray, num_phy: int) -> tuple[np.ndarray, np.ndarray]:
    """(phy2log int64[num_phy], logcnt int64[E]) for one layer's experts `weight` float[E]:
    every expert once, then each extra slot to the expert with the highest load per replica."""
    E = weight.size
    phy2log = list(range(E))
    cnt = np.ones(E, np.int64)
    for _ in range(num_phy - E):
        e = int(np.argmax(weight / cnt))
        phy2log.append(e)
        cnt[e] += 1
    return np.asarray(phy2log, np.int64), cnt


def rebalance_experts(weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int,
                      num_gpus: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EPLB's entry point: (phy2log int64[L, R], log2phy int64[L, E, maxcnt], logcnt int64[L, E]).

    Physical slot p of the result lives on GPU p // (R / num_gpus); GPUs are grouped into nodes
    contiguously. Hierarchical when num_groups % num_nodes == 0, else global.
    """
    L, E = weight.shape
    R = num_replicas
    if R < E or R % num_gpus or num_gpus % num_nodes or E % num_groups:
        raise InputError(f"eplb: {R} replicas, {E} experts, {num_groups} groups, {num_nodes} "
                         f"nodes, {num_gpus} GPUs do not divide evenly")
    if num_groups % num_nodes:
        num_groups, num_nodes = 1, 1
    per_node_phy = R // num_nodes
    gpus_per_node = num_gpus // num_nodes
    group_size = E // num_groups
    phy2log = np.empty((L, R), np.int64)
    for l in range(L):
        w = weight[l].astype(np.float64)
        group_load = w.reshape(num_groups, group_size).sum(axis=1)
        group_node = balanced_packing(group_load, num_nodes)
        for node in range(num_nodes):
            experts = np.concatenate([np.arange(g * group_size, (g + 1) * group_size)
                                      for g in np.flatnonzero(group_node == node)])
            local, cnt = replicate_experts(w[experts], per_node_phy)
            load = w[experts][local] / cnt[local]
            gpu = balanced_packing(load, gpus_per_node, label=local)
            order = np.lexsort((-load, gpu))  # GPU-major, heavier replicas first within a GPU
            phy2log[l, node * per_node_phy:(node + 1) * per_node_phy] = experts[local[order]]
    logcnt = np.stack([np.bincount(row, minlength=E) for row in phy2log])
    log2phy = np.full((L, E, int(logcnt.max())), -1, np.int64)
    for l in range(L):
        seen = np.zeros(E, np.int64)
        for p, e in enumerate(phy2log[l]):
            log2phy[l, e, seen[e]] = p
            seen[e] += 1
    return phy2log, log2phy, logcnt


@SOLVERS.register("eplb", replicas=True, preserves_groups=False, mode_aware=False)
def eplb(p: PlacementProblem) -> Placement:
    """Balance the fit trace's expert load over devices, hierarchically by node when the model's
    expert groups allow (DeepSeek-V3: 8 groups), with `redundant` replicas."""
    meta = p.trace.meta
    groups = meta.num_expert_groups if meta.num_expert_groups % p.num_nodes == 0 else 1
    if groups == 1 and p.num_nodes > 1 and meta.num_experts % p.num_nodes == 0:
        groups = p.num_nodes  # no model groups: contiguous expert ranges stand in for them
    phy2log, _, _ = rebalance_experts(p.expert_load().astype(np.float64),
                                      meta.num_experts + p.redundant, groups, p.num_nodes,
                                      p.num_devices)
    return Placement(phy2log, meta.num_experts, p.num_devices, p.node_of(), "eplb",
                     info={"expert_groups": groups})
