"""Locality-aware replicas of the `sempar` solver (placement/sempar/solver.py, `--redundant R`):
which experts get the R / G extra slots of each device (`add_replicas`), tp mode's balancing pass
after them (`balance_pass`, `tp_replicas`), and the replicated placement built from them. Served
loads follow the evaluator's serving rule (`placement.serving`).
Shapes: N experts, G devices, L layers, U fit tokens.
"""

from __future__ import annotations

import numpy as np

from sempar.affinity.routing_stats import AffinityStats
from sempar.placement import serving
from sempar.placement.base import PlacementProblem
from sempar.placement.placement import Placement
from sempar.placement.sempar.load import LoadModel, onehot

REPLICA_MARGIN = 3.0    # x the primary's robust margin, taken off the replica step's cap
# With replicas to follow, the primary placement's cap keeps only this share of the headroom
# above the mean load (ours: served loads with replicas drift further from their fit values
# on unseen routing than the primary's loads do, so the primary leaves them room).
REPLICA_SLACK = 1.0
# The replica step's served-load cap keeps this share of the primary cap's headroom above the
# mean (ours: replicas can split a hot expert's load, so the step can aim below the primary's
# cap and leave held-out routing the room that fit loads at the cap lack). On tiny-moe64 (EP 4,
# 8) 0 and 0.2 gave the same placements: with the margin below, the cap stays under the fit
# peak, so the step balances throughout and locality breaks its ties.
REPLICA_TARGET = 0.2
# tp mode's balancing pass after the replica step (`balance_pass`, ours): robust served loads
# with PASS_Z x the load model's margin, swaps while the peak is above (1 + PASS_PEAK) x the mean,
# at most PASS_MOVES x G swaps a round, PASS_ROUNDS rounds (each kept only if the peak stays
# lower once the tokens follow). tiny-moe64 R = G, held out (EP 4 / EP 8), machine loaded:
# without the pass 0.430 / 0.2725 LAR at imbalance 1.047 / 1.080; one round of 4 G moves 0.423 /
# 0.256 at 1.033 / 1.056; one round of 12 G: 0.413 / 0.250 at 1.032 / 1.045; this setting 0.409
# / 0.253 at 1.031 / 1.039; PASS_PEAK -0.05 (every move) 0.392 / 0.243 at 1.019 / 1.036. A
# price cap on the swaps (locality lost per unit of peak lowered <= 2..100) left EP 8 at
# 1.077-1.086: the swaps that matter there are the costly ones. The planted instance
# (tests/test_sempar_solver.py) keeps 0.843 with replicas: its rounds are undone by the tokens.
PASS_Z = 1.5
PASS_PEAK = 0.0
PASS_MOVES = 12
PASS_ROUNDS = 2
# dp mode: experts replicated on every device before the primary is solved (`dp_hot`). Held out,
# R = G, tiny-moe64 EP 4 / 8: 0.344 / 0.212 LAR at 1.064 / 1.132 (locality-first replicas only:
# 0.310 / 0.181 at 1.059 / 1.131). In tp mode only as a fallback: seeding tp's replica step with
# the hottest expert everywhere measured tiny-moe64 EP 4 0.447 at 1.030, EP 8 0.298 at 1.056 (above
# the 1.05 target) and tiny-mixtral EP 4 0.722 at 1.173 (0.529 at 1.346 without).
DP_HOT = 1
# tp mode: the hottest expert on every device as a second try where the replica step leaves
# the robust fit peak above the primary's cap (`tp_replicas`; ours). Always seeding it (above)
# cost tiny-moe64 EP 8 its 1.05; as a fallback it leaves tiny-moe64 as it was (EP 4 0.409 at
# 1.031, EP 8 0.253 at 1.039) and takes tiny-mixtral EP 4 from 0.529 at 1.346 to 0.623 at 1.140
# (eplb 0.539 at 1.404: 1.16x), EP 8 0.584 at 1.56 -> 0.582 at 1.65 (held out, R = G).
TP_HOT_FALLBACK = True
FULL_SCAN = 4096        # open (device, expert) pairs the replica step scores in full (`_candidates`)
TOP_PAIRS = 256


def tp_replicas(C, dev: np.ndarray, items: np.ndarray, assign, lm: LoadModel, per_device: int,
                node_of: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hosts bool[G, N], token device int[U]): tp mode's replicas for one layer.

    C [U, N] (CSR): activations of each expert by each fit token; dev int[N] the primary
    placement, items int[U] its token devices; assign: local float[U, G] -> int[U] (the token
    step's capacity rule). `add_replicas` (balance first), then `PASS_ROUNDS` rounds of
    `balance_pass` and the tokens re-assigned against the replicated hosts; shapes with more
    than `FULL_SCAN` (device, expert) pairs skip the pass (its swaps are scored in full).
    Where that leaves the robust fit peak above the primary's cap (balance out of reach, e.g. a
    layer whose hottest expert carries more than a device's share), the same again with the
    hottest expert first put on every device (`TP_HOT_FALLBACK`, ours), and the variant with
    the lower robust fit peak is kept."""
    G = lm.cap_devices
    h = onehot(dev, G).T.astype(bool)
    hosts, toks, peak = _tp_variant(C, dev, h, items, assign, lm, per_device, node_of,
                                    allowed)
    if TP_HOT_FALLBACK and peak > lm.cap and per_device * G >= G - 1:
        hot = int(np.argmax(lm.load))
        need = np.full(G, per_device)
        for d in range(G):
            if not h[d, hot] and allowed[d, hot]:
                h[d, hot] = True
                need[d] -= 1
        seeded = _tp_variant(C, dev, h, items, assign, lm, need, node_of, allowed)
        if seeded[2] < peak:
            hosts, toks = seeded[:2]
    return hosts, toks


def _tp_variant(C, dev: np.ndarray, h: np.ndarray, items: np.ndarray, assign, lm: LoadModel,
                need, node_of: np.ndarray, allowed: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, float]:
    """(hosts, token device, robust fit peak): `tp_replicas`' steps from hosts h bool[G, N]
    (the primary dev int[N] and any replicas already set) with `need` (int or int[G]) replica
    slots left per device."""
    G = lm.cap_devices
    Wt = np.asarray(C.T @ onehot(items, G)).T
    h = add_replicas(h, Wt, need, replica_cap(lm, dev), node_of, allowed,
                     lm if lm.sigma is not None else None)
    target = (1 + PASS_PEAK) * float(Wt.sum()) / G

    def follow(hosts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        toks = assign(np.asarray(C @ hosts.T.astype(np.float32)))       # tokens follow the hosts
        W = np.asarray(C.T @ onehot(toks, G)).T
        return hosts, toks, W, float(_robust_served(hosts, W, lm, PASS_Z, node_of)[0].max())
    peak = float(_robust_served(h, Wt, lm, PASS_Z, node_of)[0].max())
    done = None
    for _ in range(PASS_ROUNDS if h.size <= FULL_SCAN else 0):   # large shapes: no pass
        new = follow(balance_pass(h, Wt, lm, node_of, target, PASS_Z, PASS_MOVES * G))
        if new[3] >= peak:      # the tokens, following the swaps, undid them: keep the last round
            break
        h, items, Wt, peak = done = new
    hosts, toks, _, peak = done or follow(h)
    return hosts, toks, peak


def dp_hot(Q: np.ndarray, G: int, redundant: int) -> np.ndarray:
    """int64[<= DP_HOT]: the experts dp mode replicates on every device (the hottest by fit
    activations, Q float[R, N]); none without replicas or with fewer than G - 1 of them."""
    if redundant < G - 1 or G < 2:
        return np.zeros(0, np.int64)
    k = min(DP_HOT, redundant // (G - 1))
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
                node_of: np.ndarray, allowed: np.ndarray, hot: np.ndarray) -> np.ndarray:
    """bool[G, N]: dp mode's replicas for one layer: the `hot` experts (`dp_hot`) on every device,
    then the slots left by `add_replicas`, locality first. Q float[R, N] every fit request's
    activations, dev int[N] the primary, z int[R] the requests' ranks."""
    G = lm.cap_devices
    h = onehot(dev, G).T.astype(bool)
    Wt = (Q.T @ onehot(z, G)).T.astype(np.float64)
    need = np.full(G, per_device)
    for e in hot:
        for d in range(G):
            if need[d] and not h[d, e] and allowed[d, e]:
                h[d, e] = True
                need[d] -= 1
    if need.any():
        h = add_replicas(h, Wt, need, replica_cap(lm, dev), node_of, allowed,
                         balance_first=False)
    return h


def replica_cap(lm: LoadModel, dev: np.ndarray) -> float:
    """The served-load cap of the replica step: the mean load plus `REPLICA_TARGET` of the
    primary cap's headroom, less `REPLICA_MARGIN` x the primary placement's largest robust margin
    sqrt(ROBUST x V_d) (ours: served loads depend on homes, so their resampling variance is not
    tracked; the primary's margin stands in for it)."""
    G = lm.cap_devices
    plain = np.bincount(dev, weights=lm.load, minlength=G)
    mean = float(lm.load.sum()) / G
    return (mean + REPLICA_TARGET * (lm.cap - mean)
            - REPLICA_MARGIN * max(float((lm.of(dev, G) - plain).max()), 0.0))


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
                 node_of: np.ndarray, allowed: np.ndarray, lm: LoadModel | None = None,
                 balance_first: bool = True) -> np.ndarray:
    """bool[G, N]: `hosts` plus `per_device` replicas on every device, one (device, expert)
    pair at a time, its served loads computed exactly (`_served_one` for the expert it
    changes): while the most loaded device is above `cap`, the pair that lowers the peak most
    (ties: the most fit activations made local, Wt[d, e]); then the pair with the most fit
    activations made local whose peak stays under `cap` (else the lowest peak). Balance first
    (ours): a replica on a lower device id than the expert's hosts also takes the activations
    of every token homed elsewhere (the serving rule), the strongest lever the step has on
    the peak. allowed bool[G, N]. With `lm` the loads are robust like `LoadModel.of`: device d
    adds sqrt(a_d^T Sigma a_d) - offset, a_d[e] the share of expert e's fit activations d serves
    (ours: the primary's resampling spread, carried to served loads; held out, tiny-moe64 EP 4
    R = G, 1.055 -> 1.047 imbalance). `balance_first` False (dp mode): the pair with the most
    fit activations made local among those that do not raise the peak above max(cap, peak)."""
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
        for d, e in _candidates(hosts, Wt, need, allowed, int(L.argmax())):
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


def _candidates(hosts: np.ndarray, Wt: np.ndarray, need: np.ndarray, allowed: np.ndarray,
                peak: int) -> list[tuple[int, int]]:
    """The (device, expert) pairs `add_replicas` scores: every open pair up to `FULL_SCAN` of
    them; above (large G x N, e.g. EP 64 x 256 experts), the `TOP_PAIRS` with the most fit
    activations made local plus every replica of an expert of the `peak` device (the pairs that
    can move load off it)."""
    open_ = ~hosts & allowed & (need[:, None] > 0)
    if open_.sum() <= FULL_SCAN:
        return [(int(d), int(e)) for d, e in zip(*np.nonzero(open_))]
    gain = np.where(open_, Wt, -np.inf)
    top = np.argsort(-gain, axis=None, kind="stable")[:TOP_PAIRS]
    pick = np.zeros_like(open_)
    pick.reshape(-1)[top] = True
    pick |= open_ & hosts[peak][None, :]
    return [(int(d), int(e)) for d, e in zip(*np.nonzero(pick & open_))]


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
            prim = np.flatnonzero(hosts[l][d] & (expert_device[l] == d))
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
