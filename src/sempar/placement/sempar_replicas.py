"""Locality-aware replicas of the `sempar` solver (placement/sempar_solver.py, `--redundant R`):
which experts get the R / G extra slots of each device, and the replicated placement built from
them. Served loads follow the evaluator's serving rule (`metrics.serving_device`).
Shapes: N experts, G devices, L layers, U fit tokens.
"""

from __future__ import annotations

import numpy as np

from sempar.affinity.routing_stats import AffinityStats
from sempar.placement.base import PlacementProblem
from sempar.placement.placement import Placement
from sempar.placement.sempar_load import LoadModel

REPLICA_MARGIN = 3.0    # x the primary's robust margin, taken off the replica step's cap
# With replicas to follow, the primary placement's cap keeps only this share of the headroom
# above the mean load (ours: served loads with replicas drift further from their fit values
# on unseen routing than the primary's loads do, so the primary leaves them room).
REPLICA_SLACK = 1.0


def serving_load(hosts: np.ndarray, Wt: np.ndarray, node_of: np.ndarray) -> np.ndarray:
    """float64[G]: activations each device serves, evaluator's rule (`metrics.serving_device`):
    the home's replica, else the lowest-id replica on the home's node, else the lowest-id one.

    hosts bool[G, N]; Wt float[G, N]: activations of e by the tokens homed on d."""
    G, N = hosts.shape
    L = (Wt * hosts).sum(axis=1)
    for h in range(G):
        miss = ~hosts[h] & (Wt[h] > 0)
        if not miss.any():
            continue
        e = np.flatnonzero(miss)
        rank = np.where(node_of[:, None] == node_of[h], 0, 1) * G + np.arange(G)[:, None]
        score = np.where(hosts[:, e], rank, np.iinfo(np.int64).max)
        np.add.at(L, score.argmin(axis=0), Wt[h, e])
    return L


def replica_cap(lm: LoadModel, dev: np.ndarray) -> float:
    """The served-load cap of the replica step: the cap less the primary placement's largest
    robust margin sqrt(ROBUST x V_d) (ours: served loads depend on homes, so their resampling
    variance is not tracked; the primary's margin stands in for it)."""
    G = lm.cap_devices
    plain = np.bincount(dev, weights=lm.load, minlength=G)
    return lm.cap - REPLICA_MARGIN * max(float((lm.of(dev, G) - plain).max()), 0.0)


def add_replicas(hosts: np.ndarray, Wt: np.ndarray, per_device: int, cap: float,
                 node_of: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """bool[G, N]: `hosts` plus `per_device` replicas on every device, greedily the (device,
    expert) pair with the most fit activations made local (Wt[d, e]) whose served loads stay
    under `cap` (else the pair that leaves the smallest maximum). allowed bool[G, N]."""
    hosts = hosts.copy()
    G, N = hosts.shape
    need = np.full(G, per_device)
    while need.any():
        L = serving_load(hosts, Wt, node_of)
        gain = np.where(~hosts & allowed & (need[:, None] > 0), Wt, -np.inf)
        best = None
        # candidates by decreasing gain; the first under the cap wins
        flat = np.argsort(-gain, axis=None, kind="stable")[: max(4 * G, 64)]
        for f in flat:
            d, e = divmod(int(f), N)
            if not np.isfinite(gain[d, e]):
                break
            hosts[d, e] = True
            peak = serving_load(hosts, Wt, node_of).max()
            hosts[d, e] = False
            if peak <= max(cap, L.max()):
                best = (d, e)
                break
            if best is None or peak < best[2]:
                best = (d, e, peak)
        d, e = best[0], best[1]
        hosts[d, e] = True
        need[d] -= 1
    return hosts



def replicated_placement(p: PlacementProblem, name: str, expert_device: np.ndarray,
                         hosts: list[np.ndarray], stats: AffinityStats,
                         token_device: np.ndarray | None, info: dict) -> Placement:
    """A placement with replicas: device d's slots are its primary experts (ascending) then its
    replicas; the token table as `coclustered_placement`'s, shares counted over all hosts."""
    from sempar.predict.token_table import TokenTable

    L, N = expert_device.shape
    G, U = p.num_devices, stats.U
    phy2log, device = [], np.empty((L, U), np.int16)
    conf = np.empty((L, U), np.float32)
    for l in range(L):
        row = []
        for d in range(G):
            prim = np.flatnonzero(expert_device[l] == d)
            extra = np.flatnonzero(hosts[l][d] & (expert_device[l] != d))
            row.extend(prim.tolist() + extra.tolist())
        phy2log.append(row)
        C = stats.counts(l)
        share = np.asarray(C @ hosts[l].T.astype(np.float32)) / (stats.k * stats.a)[:, None]
        best = share.argmax(axis=1) if token_device is None else token_device[l]
        device[l] = best
        conf[l] = share[np.arange(U), best]
    info = dict(info, token_table=TokenTable(stats.tokens, device, conf))
    return Placement(np.asarray(phy2log), N, G, p.node_of(), name, info=info)
