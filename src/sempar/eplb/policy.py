"""The engine-balancer policy (docs/design.md, "Engine balancer"): at every rebalance, a
physical_to_logical map that keeps FILE's locality, balances the live load window with the
engine's redundant slots, and moves few experts relative to the old map.

Per layer l (live load w float[N], P = G x S slots, R = P - N redundant; load scenarios W
float[K, N], `scenario_loads`: row 0 the live window, rows 1.. contiguous splits of FILE's
sample rows, each scaled to w's total, `PluginConfig.scenario_count`; K = 1 is the live window alone):
1. **Replica counts** from the live load (rule `load`, step 3): every expert once, each redundant slot to the expert
   with the highest load per copy (DeepSeek EPLB's `replicate_experts`, sempar's port in
   `placement/eplb.py`, vectorised over layers here).
2. **Locality layout**: each expert's primary copy on its device in FILE's layout
   (`Source.home`: a placement's own, or for a stats FILE `PluginConfig.layout`'s, by default
   sempar's rows-objective solver on FILE's sample, `layout.py`), the devices relabelled to overlap the old map most (Hungarian,
   `scipy.optimize.linear_sum_assignment`, as `placement.migration.align_devices` does for
   whole placements): a relabelling moves nothing and keeps every co-location.
3. **Redundant copies** (`PluginConfig.replica_rule_of`): rule `home` (ours, opt-in) gives by load (below) only the copies an expert needs for one copy to fit a
   device's bound (`_needed_copies`), then fills each device's free slots with the experts
   its experts co-activate with most (`_home_replicas`: a copy on a token's own device
   serves it under SGLang's static dispatch); rule `cold` (ours, opt-in) likewise,
   the free slots to the least-loaded experts a device lacks (vLLM's hash spreads a
   replicated expert's tokens over its copies: a copy of a hot expert costs its locality, a
   cold one's costs almost none); rule `load` (DeepSeek EPLB's), every copy where the load
   needs it: heaviest copy first (its worst scenario),
   to the device with a free slot that does not host the expert whose worst scenario is lowest
   after it; among devices within 2% of the mean load of that minimum, the one whose experts
   co-activate most with it.
4. **Balance swaps**: while the hottest (scenario, device) is above its bound (`max_imbalance`
   x the mean; a split's + `scenario_slack`), swap one of that device's copies with a copy on
   another device: among the swaps that cut the peak over every scenario by at least
   `swap_min_cut` (0.5) x the best cut, the one that loses the least affinity (`swap_rule`
   "balance-first", the default; "per-cut": the least affinity lost per unit of cut; the
   balance-first rule of
   `placement/sempar/experts.py`'s swap search, restricted to the hottest device so a swap
   costs O(S x P x K); compiled with numba in `swaps.py`). Balancing the worst scenario
   (ours, issue 43: under drift the next window is not the last one, and experts grouped for
   locality spike together) pulls apart groups that overload a device in some run of
   requests, which the summed window hides.
5. **Slots kept**: an expert that stays on its device keeps its old slot (what vLLM's
   `preserve_intragpu_slots` does for its own policy), so only slots whose expert changed are
   copied.
6. **Budget**: a layer is re-laid only when its imbalance (the worst scenario's, less its
   slack) falls or its locality rises by
   `min_gain`; the re-laid layers are taken by gain per slot moved until the move budget
   (`PluginConfig.move_budget`) is spent; the others keep the old map, except that a layer
   still above `max_imbalance` gets balance swaps only (step 4 on its old layout) from what
   the budget has left. Without an old map (the first call) every layer is laid out.

Locality of a layer = the share of FILE's pair affinity whose two experts share a device
(1.0 = all of FILE's co-location kept). Ours: the steps and their order (no engine or paper
ships a locality-aware EPLB policy).
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from sempar.eplb.config import PluginConfig
from sempar.eplb.layout import layout_line
from sempar.eplb.report import RebalanceReport, _hosts, _lar_cached
from sempar.eplb.source import Source
from sempar.eplb.scenarios import caps_of as _caps, robust_imbalance as _robust, scenario_loads
from sempar.eplb.swaps import balance_swaps
from sempar.placement.metrics import peak_ratio

EPS = 1e-12


def replica_counts(weight: np.ndarray, P: int, G: int) -> np.ndarray:
    """int64[L, N]: copies of each expert, every expert once and each of the P - N redundant
    slots to the expert with the highest load per copy (step 1), all layers at once."""
    L, N = weight.shape
    cnt = np.ones((L, N), np.int64)
    rows = np.arange(L)
    for _ in range(P - N):
        e = np.argmax(np.where(cnt < G, weight / cnt, -1.0), axis=1)   # a copy per device at most
        cnt[rows, e] += 1
    return cnt


def _locality(hosts: np.ndarray, A: np.ndarray, total: float) -> float:
    """Share of the pair affinity A float[N, N] (zero diagonal) whose experts share a device."""
    if total <= EPS:
        return 1.0
    H = hosts.astype(np.float32)
    return float(((H @ A) * H).sum() / total)


def _loads(hosts: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64[G] (w float[N]) or float64[K, G] (w float[K, N], scenarios): each device's share
    of the load, an expert's load split evenly over its copies (what both engines' own
    policies assume)."""
    cnt = np.maximum(hosts.sum(axis=0), 1)
    return (w / cnt) @ hosts.T.astype(np.float64)


def map_loads(row: np.ndarray, w: np.ndarray, G: int) -> np.ndarray:
    """float64[G] (w float[N]) or float64[K, G] (w float[K, N], scenarios): each device's share
    of the load under slot row int[P] (-1: empty), an expert's load split evenly over its
    slots, two slots of one expert on a device counted twice (the engines' own maps may do
    that)."""
    ok = row >= 0
    safe = np.where(ok, row, 0)
    cnt = np.bincount(row[ok], minlength=w.shape[-1])
    share = np.where(ok, w[..., safe] / np.maximum(cnt[safe], 1), 0.0)
    return share.reshape(*w.shape[:-1], G, -1).sum(axis=-1)


def _imbalance(load: np.ndarray) -> float:
    """max / mean of device loads float[G]; of float[K, G] scenarios, the worst scenario's."""
    return float(peak_ratio(load).max())


def _relabel(home: np.ndarray, old_hosts: np.ndarray | None, G: int) -> np.ndarray:
    """home int64[N] with devices renamed to overlap `old_hosts` bool[G, N] most (step 2)."""
    if old_hosts is None:
        return home
    M = old_hosts[:, None, :] & (home[None, None, :] == np.arange(G)[None, :, None])
    overlap = M.sum(axis=2)                                   # [old device, home group]
    old_dev, grp = linear_sum_assignment(-overlap)
    perm = np.empty(G, np.int64)
    perm[grp] = old_dev
    return perm[home]


def _make_room(hosts: np.ndarray, used: np.ndarray, load: np.ndarray, aff: np.ndarray,
               share: np.ndarray, A: np.ndarray, e: int, S: int) -> None:
    """Free a slot for a copy of expert e on a device without it, when the only free slots are
    on devices that host e: a copy x moves from a full device d (without e) to a free device f
    (without x), the move that leaves the lower peak (of the live window, scenario 0). load
    float64[K, G], share float64[K, N]. Updates the arrays in place."""
    fs = np.flatnonzero(used < S)
    ds = np.flatnonzero(~hosts[:, e])
    best = None
    for f in fs:
        for d in ds:
            xs = np.flatnonzero(hosts[d] & ~hosts[f])
            if xs.size == 0:
                continue
            peak = np.maximum(load[0, f] + share[0, xs], load[0, d] - share[0, xs] + share[0, e])
            i = int(np.argmin(peak))
            if best is None or peak[i] < best[0]:
                best = (float(peak[i]), int(f), int(d), int(xs[i]))
    if best is None:
        raise ValueError(f"no slot for another copy of expert {e}")
    _, f, d, x = best
    hosts[d, x], hosts[f, x] = False, True
    used[d] -= 1
    used[f] += 1
    load[:, d] -= share[:, x]
    load[:, f] += share[:, x]
    aff[d] -= A[x]
    aff[f] += A[x]


def _needed_copies(W: np.ndarray, caps: np.ndarray, G: int) -> np.ndarray:
    """int64[N]: copies each expert needs so that one copy's load fits a device's bound in
    every scenario (W float64[K, N], caps float64[K]): ceil(load / (mean device load x cap)),
    1 to G. The `home` rule gives only these copies by load (an expert hotter than a device's
    bound cannot be balanced by swaps), the rest of the free slots by locality."""
    bound = W.sum(axis=1, keepdims=True) / G * caps[:, None]          # [K, 1]
    need = np.ceil(W / np.maximum(bound, EPS) - 1e-9).max(axis=0)
    return np.clip(need, 1, G).astype(np.int64)


def _home_replicas(hosts: np.ndarray, aff: np.ndarray, A: np.ndarray, S: int) -> np.ndarray:
    """int64[N]: copies of each expert after the `home` replica rule (step 3; ours, issue 43)
    filled every device's free slots (hosts bool[G, N] and aff float32[G, N] updated in
    place): each slot a copy of the expert its device's experts co-activate with most among
    those it does not host. Under a dispatch that serves a token from a copy on its own device
    (SGLang's `static`, its default), such a copy turns the device's tokens for that expert
    local; the balance swaps (step 4) then move copies where the load needs them."""
    G, N = hosts.shape
    for g in range(G):
        for _ in range(S - int(hosts[g].sum())):
            e = int(np.argmax(np.where(hosts[g], -np.inf, aff[g])))
            hosts[g, e] = True
            aff[g] += A[e]
    return hosts.sum(axis=0).astype(np.int64)


def _layout(W: np.ndarray, home: np.ndarray, cnt: np.ndarray, A: np.ndarray, G: int, S: int,
            cfg: PluginConfig) -> np.ndarray:
    """bool[G, N]: hosts of one layer after steps 2-4 (module docstring). W float64[K, N]: the
    load scenarios (`scenario_loads`, row 0 the live window); a redundant copy goes to the
    device whose worst scenario is lowest after it, the swaps lower the worst scenario."""
    K, N = W.shape
    caps = _caps(W, cfg)
    hosts = np.zeros((G, N), bool)
    hosts[home, np.arange(N)] = True
    aff = hosts.astype(np.float32) @ A                        # [G, N] affinity of e to g
    rule = cfg.replica_rule_of()
    home_rule = rule in ("home", "cold")
    if home_rule:            # step 3, `home` rule: the load rule only for the copies needed
        cnt = np.minimum(cnt, _needed_copies(W, caps, G))
    share = W / cnt
    used = hosts.sum(axis=1)
    load = share @ hosts.T.astype(np.float64)                 # [K, G]
    extra = np.repeat(np.arange(N), cnt - 1)
    extra = extra[np.argsort(-share[:, extra].max(axis=0), kind="stable")]
    for e in extra:                                           # step 3
        free = (used < S) & ~hosts[:, e]
        if not free.any():                  # free slots only where e already is: make room
            _make_room(hosts, used, load, aff, share, A, e, S)
            free = (used < S) & ~hosts[:, e]
        cand = np.flatnonzero(free)
        after = ((load[:, cand] + share[:, e:e + 1]) / caps[:, None]).max(axis=0)  # worst after
        near = cand[after <= after.min() + 0.02 * max(load[0].mean(), EPS)]
        d = int(near[np.argmax(aff[near, e])])
        hosts[d, e] = True
        used[d] += 1
        load[:, d] += share[:, e]
        aff[d] += A[e]
    if home_rule and (used < S).any():                        # the free slots: locality
        if rule == "home":
            cnt = _home_replicas(hosts, aff, A, S)
        else:                # `cold`: the least-loaded experts (worst scenario) a device lacks
            cold = np.broadcast_to(-W.max(axis=0), (G, N)).astype(np.float32).copy()
            cnt = _home_replicas(hosts, cold, np.zeros_like(A), S)
            aff = hosts.astype(np.float32) @ A
        share = W / cnt
        used = hosts.sum(axis=1)
        load = share @ hosts.T.astype(np.float64)
    if (used != S).any():                                     # N % G != 0: fill leftovers
        raise ValueError("slots left empty")
    ee = np.nonzero(hosts)[1].astype(np.int64)               # expert of each slot
    balance_swaps(load, hosts, ee, np.ascontiguousarray(share, np.float64),
                  aff.astype(np.float64), np.ascontiguousarray(A, np.float32), S, caps,
                  cfg.swaps_per_slot * S, cfg.swap_min_cut, cfg.swap_rule == "per-cut",
                  cfg.finish_live)                            # step 4 (swaps.py)
    return hosts


def _rebalance_only(W: np.ndarray, old_row: np.ndarray, A: np.ndarray, G: int, S: int,
                    cfg: PluginConfig, max_swaps: int) -> np.ndarray | None:
    """bool[G, N]: the old layout of a layer with only balance swaps (step 4, at most
    `max_swaps`, on the scenarios W float64[K, N]), the copies as they are; None when the old
    row has an empty slot or two copies of an expert on one rank (no swap is defined on it)."""
    N = W.shape[1]
    hosts = np.ascontiguousarray(_hosts(old_row, G, N))     # one compiled layout of swap_loop
    if (old_row < 0).any() or (hosts.sum(axis=1) != S).any():
        return None
    cnt = hosts.sum(axis=0)
    share = np.ascontiguousarray(W / np.maximum(cnt, 1), np.float64)
    load = np.ascontiguousarray(share @ hosts.T.astype(np.float64))
    aff = (hosts.astype(np.float32) @ A).astype(np.float64)
    ee = np.nonzero(hosts)[1].astype(np.int64)
    balance_swaps(load, hosts, ee, share, aff, np.ascontiguousarray(A, np.float32), S,
                  _caps(W, cfg), max_swaps, cfg.swap_min_cut, cfg.swap_rule == "per-cut",
                  cfg.finish_live)
    return hosts


def _row(hosts: np.ndarray, old_row: np.ndarray | None, S: int) -> np.ndarray:
    """int64[P] slot row of `hosts` bool[G, N]; an expert staying on its device keeps its old
    slot (step 5), the others fill the freed slots in expert order."""
    G, N = hosts.shape
    if old_row is None:
        return np.nonzero(hosts)[1].astype(np.int64)          # device-major, expert order
    dev = np.repeat(np.arange(G), S)
    old = np.asarray(old_row, np.int64)
    valid = (old >= 0) & (old < N)
    key = np.where(valid, dev * N + old, -1 - np.arange(old.size))
    first = np.zeros(old.size, bool)                      # the engines' own maps may put
    first[np.unique(key, return_index=True)[1]] = True    # two copies on one rank
    keep = valid & first & hosts[dev, np.where(valid, old, 0)]
    row = np.where(keep, old, -1)
    kept = np.zeros((G, N), bool)
    kept[dev[keep], old[keep]] = True
    row[np.flatnonzero(~keep)] = np.nonzero(hosts & ~kept)[1]   # both in device order
    return row


def rebalance(weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int,
              num_ranks: int, old_map: np.ndarray | None, source: Source,
              config: PluginConfig = PluginConfig()) -> np.ndarray:
    """physical_to_logical int64[L, P] of one rebalance (`rebalance_report`'s map; the engine
    policies' signature plus FILE and the config)."""
    return rebalance_report(weight, num_replicas, num_groups, num_nodes, num_ranks, old_map,
                            source, config)[0]


def rebalance_report(weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int,
                     num_ranks: int, old_map: np.ndarray | None, source: Source,
                     config: PluginConfig = PluginConfig()
                     ) -> tuple[np.ndarray, RebalanceReport]:
    """(physical_to_logical int64[L, P], what was done): one rebalance (module docstring).

    weight float[L, N]: the engine's live load window per logical expert; num_replicas P (a
    multiple of num_ranks G, >= N); old_map int[L, P] the serving map (None: first call);
    source: FILE (`source.load_source`, checked against L, N, G). num_groups / num_nodes are
    the engine's hierarchy arguments: the locality layout already groups co-activated experts,
    so they do not constrain the map (devices are contiguous within nodes as in the engines).
    Raises ValueError on shapes it cannot serve (the plug-in then falls back).
    """
    t0 = time.perf_counter()
    w = np.asarray(weight, np.float64)
    L, N = w.shape
    G, P = int(num_ranks), int(num_replicas)
    if P % G or P < N or not np.all(np.isfinite(w)) or (w < 0).any():
        raise ValueError(f"cannot place {N} experts in {P} slots on {G} ranks with this window")
    S = P // G
    if -(-N // G) > S:
        raise ValueError(f"{N} experts do not fit {G} ranks x {S} slots")
    old = None if old_map is None else np.asarray(old_map, np.int64)
    if old is not None and old.shape != (L, P):
        old = None                                   # another slot count: lay out afresh
    home_all = source.home(G, config.seed, config.layout)
    cnt = replica_counts(w, P, G)
    W = scenario_loads(w, source.sample, config.scenario_count())   # [L, K, N], W[:, 0] = w
    report = RebalanceReport(budget=config.move_budget(), layout=layout_line(source, G, config.layout))
    new_rows, gains = [], []
    imb0, imb1, loc0, loc1 = [], [], [], []      # imbalance: the worst scenario's
    live0, live1 = [], []                          # the live window's (reported)
    for l in range(L):
        A = source.affinity[l]
        total = float(A.sum())
        old_hosts = None if old is None else _hosts(old[l], G, N)
        hosts = _layout(W[l], _relabel(home_all[l], old_hosts, G), cnt[l], A, G, S, config)
        row = _row(hosts, None if old is None else old[l], S)
        ld = _loads(hosts, W[l])
        caps = _caps(W[l], config)
        i1, c1, v1 = _robust(ld, caps), _locality(hosts, A, total), _imbalance(ld[0])
        if old_hosts is None or not old_hosts.any(axis=0).all():
            new_rows.append(row)
            gains.append(None)
            i0, c0, v0 = i1, c1, v1
        else:
            ld = map_loads(old[l], W[l], G)
            i0, c0, v0 = _robust(ld, caps), _locality(old_hosts, A, total), _imbalance(ld[0])
            moved = int((row != old[l]).sum())
            gain = (i0 - i1) + (c1 - c0)
            worth = moved > 0 and (i0 - i1 >= config.min_gain or
                                   (c1 - c0 >= config.min_gain and
                                    i1 <= max(config.max_imbalance, i0) + EPS))
            new_rows.append(row)
            gains.append((gain / moved, moved) if worth else False)
        imb0.append(i0), imb1.append(i1), loc0.append(c0), loc1.append(c1)
        live0.append(v0), live1.append(v1)
    out = np.empty((L, P), np.int64) if old is None else old.copy()
    budget = report.budget
    order = sorted((l for l in range(L) if gains[l]), key=lambda l: -gains[l][0])
    take = {l for l in range(L) if gains[l] is None}  # no usable old row: must lay out
    spent = 0
    for l in order:
        if budget is None or spent + gains[l][1] <= budget:
            take.add(l)
            spent += gains[l][1]
    for l in range(L):
        if l in take:
            out[l] = new_rows[l]
        else:
            imb1[l], loc1[l], live1[l] = imb0[l], loc0[l], live0[l]
    # step 6b: layers the budget left out that are above the bound get balance swaps only,
    # two slots each, from what the budget has left (worst layer first)
    left = None if budget is None else budget - spent
    for l in sorted((l for l in range(L) if l not in take), key=lambda l: -imb0[l]):
        if (left is not None and left < 2) or imb0[l] <= config.max_imbalance + config.min_gain:
            continue
        swaps = config.swaps_per_slot * S if left is None else min(config.swaps_per_slot * S,
                                                                   left // 2)
        hosts = _rebalance_only(W[l], old[l], source.affinity[l], G, S, config, swaps)
        if hosts is None:
            continue
        row = _row(hosts, old[l], S)
        moved = int((row != old[l]).sum())
        ld = _loads(hosts, W[l])
        i1 = _robust(ld, _caps(W[l], config))
        if moved and i1 < imb0[l] - EPS and (left is None or moved <= left):
            out[l] = row
            imb1[l], live1[l] = i1, _imbalance(ld[0])
            loc1[l] = _locality(hosts, source.affinity[l], float(source.affinity[l].sum()))
            if left is not None:
                left -= moved
    report.per_layer_moves = ([int(x) for x in (out != old).sum(axis=1)] if old is not None
                              else [P] * L)
    report.moves = int(sum(report.per_layer_moves))
    report.layers_changed = int(sum(m > 0 for m in report.per_layer_moves))
    report.imbalance_before, report.imbalance_after = float(np.mean(live0)), float(np.mean(live1))
    report.locality_before, report.locality_after = float(np.mean(loc0)), float(np.mean(loc1))
    if source.sample is not None and config.lar_rows:
        T = source.sample.shape[0]          # evenly spaced rows (the sample is in arrival order)
        rows = source.sample[np.linspace(0, T - 1, min(T, config.lar_rows)).astype(np.intp)]
        rows = rows.astype(np.intp)
        report.lar_after = _lar_cached(rows, out, G, N)
        report.lar_before = report.lar_after if old is None else _lar_cached(rows, old, G, N)
    report.seconds = time.perf_counter() - t0
    return out, report
