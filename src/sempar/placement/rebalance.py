"""`sempar rebalance`: an incremental re-placement step that moves few experts and keeps locality.

From the current placement and a window of recent routing (experts int[T, L, k], token ids not
needed), choose at most `max_moves` moves (or `max_bytes` of copied weights) that most raise the
window's **exact-home LAR** (tp mode: every row homed on the device hosting most of its experts,
equal shares per batch, `capacity.capacity_home` by the solvers' search rule
`capacity.SEARCH_ASSIGN`, the greedy proposal rounds, called once per candidate move; the exact
pre-router and `evaluate`'s oracle take the optimal rule, which never scores lower) while
every layer's device load imbalance (max / mean of the served loads,
`serving`'s rule; with `split`, the load a balancing dispatch serves: each replicated
expert's load water-filled over its copies, `dispatch_peak.fill_loads`) stays within
`max_imbalance` on the window. Moves:

- **swap**: experts e1 on device g1 and e2 on g2 trade devices (two expert copies);
- **retarget** (only where the placement has redundant slots): a replica slot of an expert with
  several copies is given to another expert (drop one replica, add one: one expert copy).

Which ideas it takes from where:
- the swap search with exact gain under a load cap is `sempar`'s own expert step
  (`placement/sempar/experts.py`, after Sem-MoE Appendix B Alg. 1's alternating expert step),
  here limited to a move budget and started from the serving placement instead of from scratch;
- ranking by gain per byte, and refusing a move that does not pay its copy back, is ours
  (ExFlow and Sem-MoE solve offline and never price migration);
- restoring balance first, by moving load off the hottest device, is EPLB's aim (DeepSeek EPLB:
  per-layer load balance from the window's expert loads), with locality as the tie-breaker
  instead of ignored.

Greedy, per round: each layer proposes its best move (candidates ranked with the homes held
fixed, `candidates` of them then re-evaluated exactly: homes re-solved, served loads counted);
a layer above the bound proposes the move that cuts its imbalance most (tie: locality), the
others the move with the highest exact gain per copied byte that keeps the bound. Balance moves
go first (they are required and are not priced); a locality move is made only when it pays its
bytes back within `horizon_s` (cost model below). The round's chosen move is applied and only
its layer re-proposes.

Cost model: `placement.rebalance_plan` (`RebalanceConfig`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time

import numpy as np

from sempar.errors import InputError
from sempar.placement.capacity import SEARCH_ASSIGN, capacity_home
from sempar.placement.dispatch_peak import fill_loads
from sempar.placement.metrics import peak_ratio
from sempar.placement.placement import Placement
from sempar.placement.rebalance_plan import EPS, Move, RebalanceConfig, RebalanceResult
from sempar.placement.serving import node_order, table



def placement_hash(p: Placement) -> str:
    """SHA-256 (hex) of the placement's layout: devices, slots and `phy2log` (the parent id a
    rebalanced placement records; provenance in `info` does not change it)."""
    body = json.dumps({"num_devices": p.num_devices, "num_experts": p.num_experts,
                       "node_of": p.node_of.tolist(), "phy2log": p.phy2log.tolist()})
    return hashlib.sha256(body.encode()).hexdigest()


def imbalance(load: np.ndarray) -> float:
    """The worst scenario's max / mean device load; load float[H, G]."""
    return float(peak_ratio(load).max())


class _Layer:
    """One layer's window state: its slot row int32[P], the window's experts int[T, k], and the
    exact figures (local activations, served load float[G]) of the row."""

    def __init__(self, row: np.ndarray, experts: np.ndarray, G: int, N: int,
                 order: np.ndarray, batch: int, max_imbalance: float, weight: np.ndarray,
                 group: np.ndarray, caps: np.ndarray, split: bool = False):
        self.G, self.N, self.order, self.batch, self.split = G, N, order, batch, split
        self.experts = np.asarray(experts, np.intp)
        k = self.experts.shape[1]
        self.weight = weight                                  # float64[T] per row
        self.wk = np.repeat(weight, k)                        # per activation, [T * k]
        self.H = int(group.max()) + 1                         # scenarios the bound holds on
        self.gk = np.repeat(group, k) * G                     # scenario offset per activation
        tot = np.bincount(group, weight, minlength=self.H) * k
        self.cap = (caps * tot / G)[:, None]                  # float[H, 1] per device
        self.set(np.asarray(row, np.int32).copy())

    def figures(self, row: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """(weighted local activations, weighted served load float[H, G] per scenario,
        home int64[T]) of slot row `row`."""
        G, S = self.G, row.size // self.G
        hosts = np.zeros((G, self.N), bool)
        hosts[np.repeat(np.arange(G), S), row] = True
        hits = hosts[:, self.experts].sum(axis=2).T                        # [T, G]
        home = capacity_home(hits, self.batch, rule=SEARCH_ASSIGN)
        if self.split and row.size > self.N:       # what a balancing dispatch serves
            tot = np.bincount(self.gk // G * self.N + self.experts.ravel(), self.wk,
                              minlength=self.H * self.N).reshape(self.H, self.N)
            return float(hits[np.arange(home.size), home] @ self.weight), \
                fill_loads(row, tot, G), home
        serve = table(hosts, self.order)[home[:, None], self.experts]      # [T, k]
        load = np.bincount(self.gk + serve.ravel(), self.wk,
                           minlength=self.H * G).reshape(self.H, G)
        return float(hits[np.arange(home.size), home] @ self.weight), load, home

    def set(self, row: np.ndarray) -> None:
        self.row = row
        self.local, self.load, self.home = self.figures(row)

    @property
    def imbalance(self) -> float:
        return imbalance(self.load)

    def overload(self, load: np.ndarray | None = None) -> float:
        """Served load above the cap, summed over devices and scenarios (0 within the
        bound)."""
        load = self.load if load is None else load
        return float(np.maximum(load - self.cap, 0.0).sum())


def _candidates(st: _Layer, balance: bool, limit: int, trade: float = 0.0
                ) -> list[tuple[str, int, int]]:
    """Up to `limit` moves of layer `st`, best first by an estimate with the homes held fixed:
    ("swap", slot p1, slot p2) or ("retarget", slot p, new expert)."""
    G, N, row = st.G, st.N, st.row
    S = row.size // G
    dev = np.repeat(np.arange(G), S)                                     # device of each slot
    T = st.weight.sum()
    Wh = np.bincount(st.gk * N + (st.home[:, None] * N + st.experts).ravel(), st.wk,
                     minlength=st.H * G * N).reshape(st.H, G, N)         # [H, G, N] by home
    W = Wh.sum(axis=0)                                                   # [G, N]
    cnt = np.bincount(row, minlength=N)
    share_h = Wh.sum(axis=1) / np.maximum(cnt, 1)                        # [H, N] load per copy
    share = share_h.sum(axis=0)
    hosts = np.zeros((G, N), bool)
    hosts[dev, row] = True
    out: list[tuple[float, tuple[str, int, int]]] = []
    # swaps: slot pairs on different devices whose experts the other device does not host
    e = row.astype(np.intp)
    gain = (W[dev[None, :], e[:, None]] + W[dev[:, None], e[None, :]]
            - W[dev, e][:, None] - W[dev, e][None, :])                  # [p1, p2]
    ok = (dev[:, None] < dev[None, :]) & ~hosts[dev[None, :], e[:, None]] \
        & ~hosts[dev[:, None], e[None, :]]
    if balance:                        # total overload above the cap, cut (_swap_search's rule)
        cut = np.zeros((row.size, row.size))
        for h in range(st.H):          # per scenario, summed
            L, cap = st.load[h], st.cap[h, 0]
            delta = share_h[h, e][None, :] - share_h[h, e][:, None]      # load into dev(p1)
            over = np.maximum(L - cap, 0.0)
            new1, new2 = L[dev][:, None] + delta, L[dev][None, :] - delta
            cut += (over[dev][:, None] + over[dev][None, :] - np.maximum(new1 - cap, 0.0)
                    - np.maximum(new2 - cap, 0.0))
        score = np.where(ok & (cut > EPS), cut + max(trade, 1e-3 / max(T, 1)) * gain, -np.inf)
    else:
        score = np.where(ok & (gain > EPS), gain / 2.0, -np.inf)       # per expert copied
    flat = np.argsort(-score, axis=None)[:limit]
    for i in flat:
        if np.isfinite(score.flat[i]):
            p1, p2 = divmod(int(i), row.size)
            out.append((float(score.flat[i]), ("swap", p1, p2)))
    if row.size > N:                                                     # replica slots
        spare = np.flatnonzero(cnt[e] > 1)                               # slots of replicated experts
        if spare.size:
            g = dev[spare]
            rgain = W[g] - W[g, e[spare]][:, None]                       # [spare, N]
            rgain[hosts[g]] = -np.inf
            if balance:                # off an overloaded device: its copy's share leaves
                rscore = np.where((st.load[:, g] > st.cap).any(axis=0)[:, None],
                                  share[e[spare]][:, None]
                                  - share[None, :] + rgain / max(T, 1) * 1e-3, -np.inf)
                rscore[hosts[g]] = -np.inf
            else:
                rscore = np.where(rgain > EPS, rgain, -np.inf)           # one copy each
            for i in np.argsort(-rscore, axis=None)[:limit]:
                if np.isfinite(rscore.flat[i]):
                    s, f = divmod(int(i), N)
                    out.append((float(rscore.flat[i]), ("retarget", int(spare[s]), f)))
    out.sort(key=lambda x: -x[0])
    return [m for _, m in out[:limit]]


def _apply(row: np.ndarray, move: tuple[str, int, int]) -> np.ndarray:
    new = row.copy()
    kind, a, b = move
    if kind == "swap":
        new[a], new[b] = row[b], row[a]
    else:
        new[a] = b
    return new


def _propose(l: int, st: _Layer, cfg: RebalanceConfig, T: int):
    """(Move, new row, new figures) of layer l's best exactly-evaluated move, or None."""
    G = st.G
    S = st.row.size // G
    balance = st.overload() > EPS
    best = None
    for mv in _candidates(st, balance, cfg.candidates, cfg.trade):
        new = _apply(st.row, mv)
        local, load, _ = st.figures(new)
        imb = imbalance(load)
        gain = (local - st.local) / max(T, 1)
        copies = 2 if mv[0] == "swap" else 1
        if balance:
            cut = st.overload() - st.overload(load)
            if cut <= EPS:
                continue
            key = (cut + cfg.trade * (local - st.local), gain)
        else:
            if imb > max(cfg.max_imbalance, st.imbalance) + EPS or gain <= EPS:
                continue
            key = (gain / copies, 0.0)
        if best is None or key > best[0]:
            a, b = mv[1], mv[2]
            if mv[0] == "swap":
                m = Move(l, "swap", a // S, int(st.row[a]), b // S, int(st.row[b]), 2,
                         2 * cfg.expert_bytes, gain, st.imbalance, imb,
                         "balance" if balance else "locality")
            else:
                m = Move(l, "retarget", a // S, int(st.row[a]), a // S, int(b), 1,
                         cfg.expert_bytes, gain, st.imbalance, imb,
                         "balance" if balance else "locality")
            best = (key, m, new)
    return None if best is None else (best[1], best[2])


def payback_s(move: Move, cfg: RebalanceConfig) -> float:
    """Seconds of serving at `tokens_per_s` after which the bytes saved by `move`'s gain repay
    its copy (inf for no gain)."""
    saved = move.gain * cfg.tokens_per_s * cfg.remote_bytes
    return math.inf if saved <= 0 else move.bytes / saved


def check_window(placement: Placement, meta) -> None:
    """One line unless the window (`meta`: its `TraceMeta`) is routing of the model the
    placement was solved for: the same expert and layer counts, and the same model name, HF
    model type, MoE layer ids and expert groups where the placement records them
    (`Placement.info`, `placement.base`). Expert ids below the placement's count are not
    enough: an 8-expert window fits a 64-expert placement's ids."""
    if meta.num_experts != placement.num_experts or meta.num_layers != placement.num_layers:
        raise InputError(f"--trace: a window of {meta.num_layers} layers x {meta.num_experts} "
                         f"experts; the placement places {placement.num_layers} x "
                         f"{placement.num_experts}: another model")
    info = placement.info
    mine = {"model": meta.model, "model_type": meta.model_type,
            "layer_ids": list(meta.layers), "num_expert_groups": meta.num_expert_groups}
    for key, value in mine.items():
        theirs = info.get(key)
        if theirs is not None and value is not None and theirs != value:
            raise InputError(f"--trace: the window's {key} {value!r} is not the placement's "
                             f"{theirs!r}: routing of another model")


def rebalance(placement: Placement, experts: np.ndarray,
              cfg: RebalanceConfig = RebalanceConfig(),
              weight: np.ndarray | None = None, group: np.ndarray | None = None,
              group_caps: np.ndarray | None = None) -> tuple[Placement, RebalanceResult]:
    """The incremental step (module docstring): (new placement, what was done).

    placement: the serving placement (L layers, G devices); experts: int[T, L, k] the window's
    routing; weight: float[T] each row's weight in the objective and the bound (None: equal;
    `drift.history` weighs a load history by age). The new placement has the same shape; its `info["parent"]` is the SHA-256 of
    `placement` (`placement_hash`) and `info["rebalance"]` the summary; a token table, now stale,
    is dropped (exact homes need none).
    """
    t0 = time.perf_counter()
    T, L, _ = experts.shape
    if L != placement.num_layers:
        raise InputError(f"--trace: {L} MoE layers, the placement has {placement.num_layers}")
    if T == 0:
        raise InputError("--trace: the window holds no tokens")
    if int(experts.max()) >= placement.num_experts:
        raise InputError(f"--trace: expert id {int(experts.max())} beyond the placement's "
                         f"{placement.num_experts} experts")
    G, N = placement.num_devices, placement.num_experts
    order = node_order(placement.node_of)
    w = np.ones(T) if weight is None else np.asarray(weight, np.float64)
    if w.shape != (T,) or not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
        raise InputError(f"rebalance: row weights must be float[{T}], non-negative, not all 0")
    w = w * (T / w.sum())                   # mean 1: gains stay per (weighted) window token
    grp = np.zeros(T, np.int64) if group is None else np.asarray(group, np.int64)
    if grp.shape != (T,) or grp.min() < 0:
        raise InputError(f"rebalance: row scenarios must be int[{T}], non-negative")
    ids, grp = np.unique(grp, return_inverse=True)
    grp = grp.reshape(-1)
    caps = np.full(ids.size, cfg.max_imbalance)
    if group_caps is not None:
        caps = np.maximum(np.asarray(group_caps, np.float64)[ids], 1.0)
    layers = [_Layer(placement.phy2log[l], experts[:, l], G, N, order, cfg.batch,
                     cfg.max_imbalance, w, grp, caps, cfg.split)
              for l in range(L)]
    res = RebalanceResult(lar_before=sum(s.local for s in layers) / (T * L * experts.shape[2]),
                          imbalance_before=[s.imbalance for s in layers])
    props = [_propose(l, s, cfg, T) for l, s in enumerate(layers)]
    spent = 0.0
    while len(res.moves) < cfg.max_moves:
        live = [(l, p) for l, p in enumerate(props) if p is not None]
        bal = [(l, p) for l, p in live if p[0].reason == "balance"]
        if bal:
            l, (mv, row) = max(bal, key=lambda x: (x[1][0].imbalance_before, -x[0]))
        else:
            paid = [(l, p) for l, p in live if payback_s(p[0], cfg) <= cfg.horizon_s]
            res.skipped_unpaid = len(live) - len(paid)
            if not paid:
                break
            l, (mv, row) = max(paid, key=lambda x: (x[1][0].gain / x[1][0].copies, -x[0]))
            mv.payback_s = payback_s(mv, cfg)
        if cfg.max_bytes is not None and spent + mv.bytes > cfg.max_bytes + EPS:
            break
        spent += mv.bytes
        layers[l].set(row)
        res.moves.append(mv)
        props[l] = _propose(l, layers[l], cfg, T)
    res.lar_after = sum(s.local for s in layers) / (T * L * experts.shape[2])
    res.imbalance_after = [s.imbalance for s in layers]
    res.solve_s = time.perf_counter() - t0
    info = {k: v for k, v in placement.info.items() if k not in ("rebalance", "parent")}
    info["parent"] = placement_hash(placement)
    info["rebalance"] = {k: v for k, v in res.to_json(cfg).items() if k not in ("moves", "config")}
    if placement.token_table is not None:
        info["token_table_dropped"] = "rebalanced: the incremental step serves exact homes"
    new = Placement(np.stack([s.row for s in layers]), N, G, placement.node_of.copy(),
                    placement.method or "sempar", info)
    return new.validate(), res
