"""Replicas for the `rows` objective: extra slots that add locality and keep the load cap.

With homes from exact pre-routing (rows.py), a replica of expert e on device d makes local the
activations of e by the fit rows homed on d (W[d, e]), and it moves load: under the serving rule
(a token's expert on its home device, else a replica on the same node, else the lowest device
id; `placement.serving`) the copies of e not served at their home go to the
nearest replica, so adding d can take e's remote traffic off its first device too. The step,
per layer, `R / G` replicas on every device:

1. homes: the capacitated exact-pre-routing home of every fit row under the primary placement
   (`placement.capacity.capacity_home`, per batch, the align step);
2. one (device, expert) pair at a time, among devices with a free replica slot and experts
   they do not host: the pair with the most activations made local, W[d, e], among those whose
   device loads after the move (the serving rule applied to the fit rows' activations, homes
   held fixed) keep the peak at or under the cap; when none does, the pair that lowers the
   peak most (balance first);
3. the replicated placement is kept where the fit rows, re-homed under it, keep at least the
   primary's local activations and a peak at or under max(cap, the primary's peak); otherwise
   the same greedy with every pick lowering the peak most is tried, and the lower peak kept.

Ours (the papers do not place replicas for locality; EPLB places them for balance only): a
greedy on the exact fit objective, O(R x G x N) candidate moves per layer, each O(G).
"""

from __future__ import annotations

import numpy as np

from sempar.placement import serving
from sempar.placement.capacity import BATCH, SEARCH_ASSIGN, capacity_home
from sempar.placement.placement import Placement


def served_by_expert(W: np.ndarray, hosts: np.ndarray, order: np.ndarray) -> np.ndarray:
    """float64[G, N]: the load each expert's activations put on each device when W float[G, N]
    (by rows homed on each device) are served under the serving rule (`placement.serving`,
    `order` its device order) on hosts bool[G, N]."""
    G, N = W.shape
    target = serving.table(hosts, order)                                    # [home, expert]
    out = np.zeros((G, N))
    np.add.at(out, (target, np.broadcast_to(np.arange(N), (G, N))), W)
    return out


def served_load(W: np.ndarray, hosts: np.ndarray, node_of: np.ndarray) -> np.ndarray:
    """float64[G]: device loads of `served_by_expert` under the node order of `node_of`."""
    return served_by_expert(W, hosts, serving.node_order(node_of)).sum(axis=1)


def expert_served(w: np.ndarray, host: np.ndarray, order: np.ndarray) -> np.ndarray:
    """float64[G]: `served_by_expert` of one expert: activations w float[G], hosts bool[G]."""
    return served_by_expert(w[:, None], host[:, None], order)[:, 0]


def _layer_hits(hosts: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """int[T, G]: how many of each row's experts int[T, k] each device hosts (hosts bool[G, N])."""
    return hosts[:, experts].sum(axis=2).T


def _activations(home: np.ndarray, experts: np.ndarray, G: int, N: int) -> np.ndarray:
    """float64[G, N]: activations of each expert by the rows homed on each device."""
    W = np.zeros((G, N))
    np.add.at(W, (np.repeat(home, experts.shape[1]), experts.ravel().astype(np.int64)), 1.0)
    return W


def layer_replicas(hosts: np.ndarray, experts: np.ndarray, per_device: int, cap: float,
                   node_of: np.ndarray, batch: int = BATCH, balance: bool = False) -> np.ndarray:
    """int64[G, per_device]: the replica experts of each device at one layer (module docstring).

    hosts bool[G, N]: the primary placement; experts int[T, k]: the fit rows' experts; cap: the
    device load cap, x the mean load; balance: every pick lowers the peak most (ties: most
    activations made local), the cap aside."""
    G, N = hosts.shape
    home = capacity_home(_layer_hits(hosts, experts), batch, rule=SEARCH_ASSIGN)
    W = _activations(home, experts, G, N)
    limit = cap * W.sum() / G
    h = hosts.copy()
    order = serving.node_order(node_of)
    contrib = served_by_expert(W, h, order)                                 # [G, N]
    load = contrib.sum(axis=1)
    free = np.full(G, per_device)
    picks: list[list[int]] = [[] for _ in range(G)]
    for _ in range(G * per_device):
        best = None
        for d in np.flatnonzero(free > 0):
            for e in np.flatnonzero(~h[d]):
                h[d, e] = True
                new = expert_served(W[:, e], h[:, e], order)
                h[d, e] = False
                peak = float((load - contrib[:, e] + new).max())
                key = ((-peak, W[d, e], -d, -e) if balance else
                       (peak <= limit, W[d, e] if peak <= limit else -peak, -d, -e))
                if best is None or key > best[0]:
                    best = (key, d, e, new)
        _, d, e, new = best
        h[d, e] = True
        load += new - contrib[:, e]
        contrib[:, e] = new
        free[d] -= 1
        picks[d].append(e)
    return np.array(picks, np.int64).reshape(G, per_device)


def fit_score(hosts: np.ndarray, experts: np.ndarray, node_of: np.ndarray,
               batch: int) -> tuple[float, float]:
    """(local activations, peak / mean load) of the fit rows re-homed under hosts bool[G, N]."""
    G, N = hosts.shape
    hits = _layer_hits(hosts, experts)
    home = capacity_home(hits, batch, rule=SEARCH_ASSIGN)
    W = _activations(home, experts, G, N)
    load = served_load(W, hosts, node_of)
    return float(hits[np.arange(home.size), home].sum()), float(load.max() / load.mean())


def replicate(placement: Placement, experts: np.ndarray, redundant: int, cap: float,
              batch: int = BATCH) -> Placement:
    """`placement` (no replicas) with `redundant` / G replica slots on every device, chosen per
    layer by `layer_replicas` on the fit rows experts int[T, L, k] (module docstring, step 3)."""
    G, N = placement.num_devices, placement.num_experts
    r = redundant // G
    node_of = placement.node_of
    hosts = placement.hosts()
    rows = []
    for l in range(placement.num_layers):
        ex = np.asarray(experts[:, l], np.int64)
        reps = layer_replicas(hosts[l], ex, r, cap, node_of, batch)
        h = hosts[l].copy()
        h[np.repeat(np.arange(G), r), reps.ravel()] = True
        base_local, base_peak = fit_score(hosts[l], ex, node_of, batch)
        local, peak = fit_score(h, ex, node_of, batch)
        if local < base_local or peak > max(cap, base_peak) + 1e-9:
            alt = layer_replicas(hosts[l], ex, r, cap, node_of, batch, balance=True)
            h2 = hosts[l].copy()
            h2[np.repeat(np.arange(G), r), alt.ravel()] = True
            if fit_score(h2, ex, node_of, batch)[1] < peak:
                reps = alt
        rows.append(np.concatenate([placement.slots(l), reps], axis=1).ravel())
    out = Placement(np.stack(rows), N, G, node_of, placement.method, info=dict(placement.info),
                    request_cluster=placement.request_cluster)
    return out
