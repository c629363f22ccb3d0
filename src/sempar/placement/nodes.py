"""Node-aware device grouping for solvers that cluster onto devices without knowing nodes.

The co-clustering solvers (`semmoe`, `smoe-cem`, `metis`, `kmeans2d`) produce one co-cluster per
device, with arbitrary labels. With `--nodes N > 1`, devices `[n * G/N, (n + 1) * G/N)` share node
n (`contiguous_nodes`), so the labels decide which clusters share a node. A token whose experts
miss its own device should at least find them on its node: we therefore choose the labels so
that devices whose experts are often activated by the same tokens share a node.

This is the second stage of ExFlow's staged formulation (ExFlow §III-C: "minimize the
intra-node routing based on stage 1 results") turned around: our stage 1 is the solver's device
clustering, stage 2 groups the devices into nodes. Ours: the grouping is one permutation of
device labels for every layer (the solvers tie a token's or a request's cluster across layers,
so per-layer relabelling would break that), chosen by exact-size greedy growth from the
heaviest pair followed by pairwise swaps until none helps.

    device_affinity(placement, experts) -> W float64[G, G]
    group_devices(W, num_nodes) -> perm int64[G]   (new label of each old device)
    relabel_devices(placement, perm) -> Placement
"""

from __future__ import annotations

import numpy as np

from sempar.placement.placement import Placement, RequestClusters
from sempar.predict.token_table import TokenTable

MAX_TOKENS = 100_000    # tokens sampled to estimate device affinity (ours: enough for G <= 256)


def device_affinity(placement: Placement, experts: np.ndarray, seed: int = 0) -> np.ndarray:
    """float64[G, G]: over (token, layer) of the fit trace, how often devices g and h both host one
    of the token's selected experts (diagonal zero). experts: int[T, L, k]."""
    T = experts.shape[0]
    if T > MAX_TOKENS:
        experts = experts[np.sort(np.random.default_rng(seed).choice(T, MAX_TOKENS, replace=False))]
    hosts = placement.hosts()                                    # [L, G, N]
    G = placement.num_devices
    W = np.zeros((G, G))
    for l in range(experts.shape[1]):
        hit = hosts[l][:, experts[:, l]].any(axis=2).T.astype(np.float32)   # [T, G]
        W += hit.T @ hit
    np.fill_diagonal(W, 0.0)
    return W


def group_devices(W: np.ndarray, num_nodes: int) -> np.ndarray:
    """int64[G]: perm[g] = new label of device g so that node n gets the devices with label in
    [n * G/N, (n + 1) * G/N) and the affinity inside nodes is high. W: float[G, G] symmetric."""
    G = W.shape[0]
    size = G // num_nodes
    if num_nodes <= 1 or size <= 1:
        return np.arange(G)
    W = (W + W.T) / 2
    node = np.full(G, -1)
    for n in range(num_nodes):
        free = np.flatnonzero(node < 0)
        sub = W[np.ix_(free, free)]
        i, j = np.unravel_index(np.argmax(sub + np.where(np.eye(free.size, dtype=bool), -np.inf, 0)),
                                sub.shape) if free.size > 1 else (0, 0)
        members = [free[i]] + ([free[j]] if size > 1 else [])
        node[members] = n
        while len(members) < size:
            free = np.flatnonzero(node < 0)
            g = free[np.argmax(W[np.ix_(free, members)].sum(axis=1))]
            node[g] = n
            members.append(g)
    # Swap refinement: exchange two devices of different nodes while it raises intra-node affinity.
    improved = True
    while improved:
        improved = False
        to_node = W @ np.eye(num_nodes)[node]                    # [G, nodes]: affinity to each node
        for a in range(G):
            for b in range(a + 1, G):
                na, nb = node[a], node[b]
                if na == nb:
                    continue
                gain = (to_node[a, nb] - to_node[a, na] + to_node[b, na] - to_node[b, nb]
                        - 2 * W[a, b])
                if gain > 1e-9:
                    node[a], node[b] = nb, na
                    improved = True
                    to_node = W @ np.eye(num_nodes)[node]
    # Stable within a node: devices keep their relative order.
    order = np.lexsort((np.arange(G), node))
    perm = np.empty(G, np.int64)
    perm[order] = np.arange(G)
    return perm


def relabel_devices(placement: Placement, perm: np.ndarray) -> Placement:
    """The same placement with device g renamed perm[g]: slots, token table and request clusters."""
    G, S = placement.num_devices, placement.slots_per_device
    blocks = placement.phy2log.reshape(placement.num_layers, G, S)
    new = np.empty_like(blocks)
    new[:, perm] = blocks
    table, rc = placement.token_table, placement.request_cluster
    if table is not None:
        dev = np.where(table.device >= 0, perm[np.maximum(table.device, 0)], -1)
        table = TokenTable(table.token_id, dev, table.confidence)
    if rc is not None:
        rc = RequestClusters(rc.request_id, perm[rc.device])
    info = dict(placement.info, device_relabel=perm.tolist())
    return Placement(new.reshape(placement.num_layers, G * S), placement.num_experts, G,
                     placement.node_of, placement.method, info, token_table=table,
                     request_cluster=rc)
