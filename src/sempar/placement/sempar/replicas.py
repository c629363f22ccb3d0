"""Locality-aware replicas of the `sempar` solver (placement/sempar/solver.py, `--redundant R`):
which experts get the R / G extra slots of each device (`add_replicas`), tp mode's balancing pass
after them (`balance_pass`, `tp_replicas`), and the replicated placement built from them.

Served loads follow the evaluator's serving rule (`placement.serving`: a token's home device
if it hosts the expert, else a same-node host, else the lowest host id), so a replica's
effect on the peak is computed exactly, not estimated. Robust loads carry the primary load
model's resampling spread (`LoadModel.sigma`) to the served shares, because served loads on
unseen routing drift further from their fit values than the primary's do.

Settings (`SemparConfig`): `replica_slack` (the primary's cap, set by the solver),
`replica_target` and `replica_margin` (`replica_cap`), `pass_*` (`balance_pass` in tp mode),
`dp_hot` (`dp_hot`), `tp_hot_fallback` (`tp_replicas`), `full_scan` / `top_pairs`
(`_candidates`). Invariants: every device gains exactly R / G slots, no device hosts an
expert twice, and the balancing pass only swaps slots (each device keeps its slot count, each
expert its number of copies).
Shapes: N experts, G devices, L layers, U fit tokens.
"""

from __future__ import annotations

import numpy as np

from sempar.affinity.affinity_stats import AffinityStats
from sempar.placement import serving
from sempar.placement.base import PlacementProblem
from sempar.placement.placement import Placement, RequestClusters
from sempar.placement.sempar.config import SemparConfig
from sempar.placement.sempar.load import LoadModel, onehot

def tp_replicas(C, dev: np.ndarray, items: np.ndarray, assign, lm: LoadModel, per_device: int,
                node_of: np.ndarray, cfg: SemparConfig) -> tuple[np.ndarray, np.ndarray]:
    """(hosts bool[G, N], token device int[U]): tp mode's replicas for one layer.

    C [U, N] (CSR): activations of each expert by each fit token; dev int[N] the primary
    placement, items int[U] its token devices; assign: local float[U, G] -> int[U] (the token
    step's capacity rule). `add_replicas` (balance first), then `cfg.pass_rounds` rounds of
    `balance_pass` and the tokens re-assigned against the replicated hosts; shapes with more
    than `cfg.full_scan` (device, expert) pairs skip the pass (its swaps are scored in full).
    Where that leaves the robust fit peak above the primary's cap (balance out of reach, e.g. a
    layer whose hottest expert carries more than a device's share), the same again with the
    hottest expert first put on every device (`cfg.tp_hot_fallback`, ours; always seeding it
    costs balance where the replica step alone reaches the cap), and the variant with the
    lower robust fit peak is kept."""
    G = lm.cap_devices
    h = onehot(dev, G).T.astype(bool)
    hosts, toks, peak = _tp_variant(C, dev, h, items, assign, lm, per_device, node_of, cfg)
    if cfg.tp_hot_fallback and peak > lm.cap and per_device * G >= G - 1:
        hot = int(np.argmax(lm.load))
        need = np.full(G, per_device)
        for d in range(G):
            if not h[d, hot]:
                h[d, hot] = True
                need[d] -= 1
        seeded = _tp_variant(C, dev, h, items, assign, lm, need, node_of, cfg)
        if seeded[2] < peak:
            hosts, toks = seeded[:2]
    return hosts, toks


def _tp_variant(C, dev: np.ndarray, h: np.ndarray, items: np.ndarray, assign, lm: LoadModel,
                need, node_of: np.ndarray, cfg: SemparConfig
                ) -> tuple[np.ndarray, np.ndarray, float]:
    """(hosts, token device, robust fit peak): `tp_replicas`' steps from hosts h bool[G, N]
    (the primary dev int[N] and any replicas already set) with `need` (int or int[G]) replica
    slots left per device."""
    G = lm.cap_devices
    Wt = np.asarray(C.T @ onehot(items, G)).T
    h = add_replicas(h, Wt, need, replica_cap(lm, dev, cfg), node_of, cfg,
                     lm if lm.sigma is not None else None)
    target = (1 + cfg.pass_peak) * float(Wt.sum()) / G

    def follow(hosts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        toks = assign(np.asarray(C @ hosts.T.astype(np.float32)))       # tokens follow the hosts
        W = np.asarray(C.T @ onehot(toks, G)).T
        return hosts, toks, W, float(_robust_served(hosts, W, lm, cfg.pass_z, node_of)[0].max())
    peak = float(_robust_served(h, Wt, lm, cfg.pass_z, node_of)[0].max())
    done = None
    for _ in range(cfg.pass_rounds if h.size <= cfg.full_scan else 0):  # large shapes: no pass
        new = follow(balance_pass(h, Wt, lm, node_of, target, cfg.pass_z, cfg.pass_moves * G))
        if new[3] >= peak:      # the tokens, following the swaps, undid them: keep the last round
            break
        h, items, Wt, peak = done = new
    hosts, toks, _, peak = done or follow(h)
    return hosts, toks, peak


def dp_hot(Q: np.ndarray, G: int, redundant: int, count: int) -> np.ndarray:
    """int64[<= count]: the experts dp mode replicates on every device (the hottest by fit
    activations, Q float[R, N]; `SemparConfig.dp_hot`); none without replicas or with fewer
    than G - 1 of them."""
    if redundant < G - 1 or G < 2:
        return np.zeros(0, np.int64)
    k = min(count, redundant // (G - 1))
    return np.argsort(-Q.sum(axis=0), kind="stable")[:k].astype(np.int64)


def without(Q: np.ndarray, hot: np.ndarray) -> np.ndarray:
    """Q float[R, N] with the `hot` experts' activations dropped: on every device they are local
    to every request and split its load evenly, so the primary's requests and experts ignore them."""
    if hot.size == 0:
        return Q
    Q = Q.copy()
    Q[:, hot] = 0
    return Q


def dp_replicas(Q: np.ndarray, dev: np.ndarray, z: np.ndarray, lm: LoadModel, per_device: int,
                node_of: np.ndarray, hot: np.ndarray, cfg: SemparConfig) -> np.ndarray:
    """bool[G, N]: dp mode's replicas for one layer: the `hot` experts (`dp_hot`) on every device,
    then the slots left by `add_replicas`, locality first. Q float[R, N] every fit request's
    activations, dev int[N] the primary, z int[R] the requests' ranks."""
    G = lm.cap_devices
    h = onehot(dev, G).T.astype(bool)
    Wt = (Q.T @ onehot(z, G)).T.astype(np.float64)
    need = np.full(G, per_device)
    for e in hot:
        for d in range(G):
            if need[d] and not h[d, e]:
                h[d, e] = True
                need[d] -= 1
    if need.any():
        h = add_replicas(h, Wt, need, replica_cap(lm, dev, cfg), node_of, cfg,
                         balance_first=False)
    return h


def replica_cap(lm: LoadModel, dev: np.ndarray, cfg: SemparConfig) -> float:
    """The served-load cap of the replica step: the mean load plus `cfg.replica_target` of the
    primary cap's headroom, less `cfg.replica_margin` x the primary placement's largest robust
    margin sqrt(robust x V_d) (ours: replicas can split a hot expert's load, so the step aims
    below the primary's cap and leaves held-out routing room; served loads depend on homes, so
    their resampling variance is not tracked and the primary's margin stands in for it)."""
    G = lm.cap_devices
    plain = np.bincount(dev, weights=lm.load, minlength=G)
    mean = float(lm.load.sum()) / G
    return (mean + cfg.replica_target * (lm.cap - mean)
            - cfg.replica_margin * max(float((lm.of(dev, G) - plain).max()), 0.0))


def _serve_rank(node_of: np.ndarray) -> np.ndarray:
    """int64[G, G]: rank[h, d], the serving rule's order of device d for a token homed on h
    (`placement.serving.node_order`)."""
    return serving.node_order(node_of)


def _served_one(col: np.ndarray, w: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """float64[G]: where one expert's activations w float[G] (by the tokens homed on each device)
    are served when the devices col bool[G] host it (`placement.serving.table` under `rank`)."""
    G = col.size
    target = serving.table(col[:, None], rank)[:, 0]
    return np.bincount(target, weights=w, minlength=G)


def add_replicas(hosts: np.ndarray, Wt: np.ndarray, per_device: int, cap: float,
                 node_of: np.ndarray, cfg: SemparConfig, lm: LoadModel | None = None,
                 balance_first: bool = True) -> np.ndarray:
    """bool[G, N]: `hosts` plus `per_device` replicas on every device, one (device, expert)
    pair at a time, its served loads computed exactly (`_served_one` for the expert it
    changes): while the most loaded device is above `cap`, the pair that lowers the peak most
    (ties: the most fit activations made local, Wt[d, e]); then the pair with the most fit
    activations made local whose peak stays under `cap` (else the lowest peak). Balance first
    (ours): a replica on a lower device id than the expert's hosts also takes the activations
    of every token homed elsewhere (the serving rule), the strongest lever the step has on
    the peak. The pairs scored: `_candidates` (cfg.full_scan, cfg.top_pairs). With `lm` the
    loads are robust like `LoadModel.of`: device d adds sqrt(a_d^T Sigma a_d) - offset, a_d[e]
    the share of expert e's fit activations d serves (ours: the primary's resampling spread,
    carried to served loads). `balance_first` False (dp mode): the pair with the most fit
    activations made local among those that do not raise the peak above max(cap, peak)."""
    hosts = hosts.copy()
    G, N = hosts.shape
    rank = _serve_rank(np.asarray(node_of))
    need = np.zeros(G, np.int64) + per_device      # int, or int[G] per device
    served = np.stack([_served_one(hosts[:, e], Wt[:, e], rank) for e in range(N)])  # [N, G]
    load = np.maximum(served.sum(axis=1), 1e-12)
    while need.any():
        L = served.sum(axis=0)
        if lm is not None:                  # robust loads: served shares' resampling variance
            A = served / load[:, None]                                            # [N, G]
            M = lm.sigma @ A
            V = (A * M).sum(axis=0)
            L = L + np.sqrt(np.maximum(V, 0.0)) - lm.offset
        best = None
        for d, e in _candidates(hosts, Wt, need, int(L.argmax()), cfg.full_scan,
                                cfg.top_pairs):
            col = hosts[:, e].copy()
            col[d] = True
            new = _served_one(col, Wt[:, e], rank)
            if lm is None:
                peak = float((L - served[e] + new).max())
            else:
                dl = (new - served[e]) / load[e]
                v = V + 2 * dl * M[e] + dl * dl * lm.sigma[e, e]
                peak = float((L - np.sqrt(np.maximum(V, 0.0)) + np.sqrt(np.maximum(v, 0.0))
                              + new - served[e]).max())
            if balance_first:
                over = max(peak, cap) if L.max() > cap else (0.0 if peak <= cap else peak)
            else:                       # locality first: any pair not raising the peak
                over = 0.0 if peak <= max(cap, L.max()) else peak
            key = (over, -float(Wt[d, e]))
            if best is None or key < best[0]:
                best = (key, d, e, new)
        _, d, e, new = best
        hosts[d, e] = True
        served[e] = new
        need[d] -= 1
    return hosts


def _robust_served(hosts: np.ndarray, Wt: np.ndarray, lm: LoadModel, z: float,
                   node_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P float64[G], served float64[N, G]): `balance_pass`'s robust served loads and where
    each expert's fit activations are served (the serving rule, tokens as in Wt)."""
    rank = _serve_rank(np.asarray(node_of))
    served = np.stack([_served_one(hosts[:, e], Wt[:, e], rank) for e in range(hosts.shape[1])])
    if lm.sigma is None:
        return served.sum(axis=0), served
    A = served / np.maximum(served.sum(axis=1), 1e-12)[:, None]
    V = (A * (lm.sigma @ A)).sum(axis=0) * z * z
    return served.sum(axis=0) + np.sqrt(np.maximum(V, 0.0)) - z * lm.offset, served


def balance_pass(hosts: np.ndarray, Wt: np.ndarray, lm: LoadModel, node_of: np.ndarray,
                 target: float, z: float, max_moves: int) -> np.ndarray:
    """bool[G, N]: `hosts` after slot swaps that lower the peak robust served load (ours, after
    the replica step). Robust served load of device d: P_d = S_d + z (sqrt(V_d) - sqrt(V0)),
    S_d the fit activations d serves (serving rule, tokens fixed: Wt float[G, N]), V_d the
    resampling variance of that share (`LoadModel.sigma`, served shares as in `add_replicas`),
    V0 `LoadModel.offset`^2. While the peak P is above `target` (activations), the swap of a
    slot of the peak device with a slot of another device (the expert not hosted twice) that
    lowers the peak with the least loss of fit activations made local per unit of peak
    lowered; stops when no swap lowers it."""
    hosts = hosts.copy()
    G, N = hosts.shape
    rank = _serve_rank(np.asarray(node_of))
    sig = lm.sigma * z * z if lm.sigma is not None else np.zeros((N, N))
    off = z * lm.offset
    _, served = _robust_served(hosts, Wt, lm, z, node_of)
    load = np.maximum(served.sum(axis=1), 1e-12)
    for _ in range(max_moves):
        A = served / load[:, None]
        M = sig @ A
        V = (A * M).sum(axis=0)
        L = served.sum(axis=0)
        P = L + np.sqrt(np.maximum(V, 0.0)) - off
        p = int(P.argmax())
        peak = float(P[p])
        if peak <= target:
            break
        best = None
        into_p = {}                         # e2 -> its served loads after moving to p
        for e1 in np.flatnonzero(hosts[p]):
            for d2 in range(G):
                if d2 == p or hosts[d2, e1]:
                    continue
                E2 = np.flatnonzero(hosts[d2] & ~hosts[p])
                if E2.size == 0:
                    continue
                col = hosts[:, e1].copy()
                col[p], col[d2] = False, True
                d1 = _served_one(col, Wt[:, e1], rank) - served[e1]                   # [G]
                for e2 in E2:
                    if (e2, d2) not in into_p:
                        c2 = hosts[:, e2].copy()
                        c2[d2], c2[p] = False, True
                        into_p[e2, d2] = _served_one(c2, Wt[:, e2], rank) - served[e2]
                d2s = np.stack([into_p[e2, d2] for e2 in E2])                       # [n, G]
                a1, a2 = d1 / load[e1], d2s / load[E2][:, None]
                v = (V + 2 * a1 * M[e1] + a1 * a1 * sig[e1, e1] + 2 * a2 * M[E2]
                     + a2 * a2 * np.diag(sig)[E2][:, None] + 2 * a1 * a2 * sig[e1, E2][:, None])
                new = (L + d1 + d2s + np.sqrt(np.maximum(v, 0.0)) - off).max(axis=1)
                loss = Wt[p, e1] + Wt[d2, E2] - Wt[d2, e1] - Wt[p, E2]
                drop = peak - new
                ok = drop > 1e-9 * max(peak, 1.0)
                if not ok.any():
                    continue
                score = np.where(ok, np.maximum(loss, 0.0) / np.where(ok, drop, 1.0), np.inf)
                i = int(np.argmin(score))
                key = (float(score[i]), -float(drop[i]))
                if best is None or key < best[0]:
                    best = (key, e1, d2, int(E2[i]), d1, d2s[i])
        if best is None:
            break
        _, e1, d2, e2, d1, dd2 = best
        hosts[p, e1], hosts[d2, e1], hosts[d2, e2], hosts[p, e2] = False, True, False, True
        served[e1] += d1
        served[e2] += dd2
    return hosts


def _candidates(hosts: np.ndarray, Wt: np.ndarray, need: np.ndarray, peak: int,
                full_scan: int, top_pairs: int) -> list[tuple[int, int]]:
    """The (device, expert) pairs `add_replicas` scores: every open pair up to `full_scan` of
    them; above (large G x N, e.g. EP 64 x 256 experts), the `top_pairs` with the most fit
    activations made local plus every replica of an expert of the `peak` device (the pairs that
    can move load off it)."""
    open_ = ~hosts & (need[:, None] > 0)
    if open_.sum() <= full_scan:
        return [(int(d), int(e)) for d, e in zip(*np.nonzero(open_))]
    gain = np.where(open_, Wt, -np.inf)
    top = np.argsort(-gain, axis=None, kind="stable")[:top_pairs]
    pick = np.zeros_like(open_)
    pick.reshape(-1)[top] = True
    pick |= open_ & hosts[peak][None, :]
    return [(int(d), int(e)) for d, e in zip(*np.nonzero(pick & open_))]


def replicated_placement(p: PlacementProblem, name: str, expert_device: np.ndarray,
                         hosts: list[np.ndarray], stats: AffinityStats,
                         token_device: np.ndarray | None, info: dict,
                         request_cluster: RequestClusters | None = None) -> Placement:
    """A placement with replicas: device d's slots are its primary experts (ascending) then its
    replicas; the token table as `coclustered_placement`'s, shares counted over all hosts;
    request_cluster: the solver's request clusters (dp mode), or None."""
    from sempar.predict.token_table import TokenTable

    L, N = expert_device.shape
    G, U = p.num_devices, stats.U
    phy2log, device = [], np.empty((L, U), np.int16)
    conf = np.empty((L, U), np.float32)
    for l in range(L):
        row = []
        for d in range(G):
            prim = np.flatnonzero(hosts[l][d] & (expert_device[l] == d))
            extra = np.flatnonzero(hosts[l][d] & (expert_device[l] != d))
            row.extend(prim.tolist() + extra.tolist())
        phy2log.append(row)
        C = stats.counts(l)
        share = np.asarray(C @ hosts[l].T.astype(np.float32)) / (stats.k * stats.a)[:, None]
        best = share.argmax(axis=1) if token_device is None else token_device[l]
        device[l] = best
        conf[l] = share[np.arange(U), best]
    return Placement(np.asarray(phy2log), N, G, p.node_of(), name, info=dict(info),
                     token_table=TokenTable(stats.tokens, device, conf),
                     request_cluster=request_cluster)
