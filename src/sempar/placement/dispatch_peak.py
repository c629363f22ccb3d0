"""The peak device load a balancing dispatch can reach on a layout, and the replica slots that
lower it on several load scenarios at once (issue 45, item 3: replicas under drift).

A balancing dispatch (`lp`, `lp-cap`, `placement.dispatch`) may send any activation of a
replicated expert to any of its copies. With splittable loads, the least peak over the devices
is a max-flow bound (Hall's condition for fractional assignment): for every set D of devices,
the experts whose copies all lie in D must be served inside D, so

    peak* = max over non-empty D of  load(experts with copies only in D) / |D|,

and a split reaching it exists. With G devices that is 2^G - 1 sets: one histogram of the
experts' copy masks and a subset-sum (zeta) transform, exact and cheap for G <= 16
(`min_peak`). Ours (the papers and EPLB place replicas by load alone): the peak is the one the
dispatch actually serves, not the nearest copy's.

Above `MAX_DEVICES` the exact bound is out of reach; `fill_loads` gives a feasible split instead
(each replicated expert's load, heaviest first, water-filled over its copies' devices: an upper
bound on peak*), and `replica_pass` uses it there, over a narrower candidate set (slots on the
least loaded devices, retargeted to the experts of most load per copy) so that it still runs
(it was skipped above 16 devices before).

`replica_pass` retargets replica slots (a copy of an expert with several copies given to
another expert: one expert copy moved) greedily, per layer, to lower the worst over scenarios of
peak* / (cap x mean load) (the scenarios: windows of recent load, each with its cap, or
`ReplicaPass.target` for all); it moves only while that worst is above 1 and a move lowers it
by `min_cut`, at most `max_moves` per layer (with the default target 1.0: while a move lowers
the worst window's peak at all).
With `ReplicaPass.locality` (and the tokens of the youngest window) it chooses among the
retargets of nearly the least worst the one of most local activations, and with
`locality_free` also retargets for locality alone that do not raise the worst
(`placement.replica_locality`; off by default: measured in docs/drift.md).

Shapes: N experts, G devices, P = G x S slots, H scenarios, M = 2^G copy masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sempar.errors import InputError
from sempar.placement.replica_locality import local_gain, token_experts

MAX_DEVICES = 16        # 2^G masks per scenario: beyond this the exact bound is too large


@dataclass(frozen=True)
class ReplicaPass:
    """`replica_pass`'s knobs: at most `max_moves` replica retargets per layer per update;
    scenario caps (x the scenario's mean device load) are given by the caller."""

    max_moves: int = 2
    min_cut: float = 1e-3   # a move must lower the worst scenario ratio by at least this
    target: float | None = 1.0    # every scenario's cap (None: the caller's caps): 1.0 keeps
                                  # raising the slots' slack while moves lower the worst window
    locality: float = 0.0   # with the tokens given: among retargets within this of the least
                            # worst ratio, the one of most local activations
                            # (`placement.replica_locality`; 0: the peak alone)
    locality_free: bool = False   # and, once none lowers the worst, retargets that do not raise
                                  # it and gain locality (moves for locality alone)

    def __post_init__(self) -> None:
        if self.max_moves < 0 or self.min_cut < 0 or self.locality < 0:
            raise InputError(f"replica pass: max_moves {self.max_moves} / min_cut "
                             f"{self.min_cut} / locality {self.locality} out of range")


def _masks(row: np.ndarray, G: int, N: int) -> np.ndarray:
    """int64[N]: bit g set where device g holds a copy of the expert (slot row int[P])."""
    S = row.size // G
    m = np.zeros(N, np.int64)
    np.bitwise_or.at(m, np.asarray(row, np.int64), np.int64(1) << (np.arange(row.size) // S))
    return m


def _popcount(G: int) -> np.ndarray:
    M = 1 << G
    return np.array([bin(d).count("1") for d in range(M)], np.float64)


def _zeta_peak(f: np.ndarray, G: int, pop: np.ndarray) -> np.ndarray:
    """float[...]: max over non-empty device sets D of (sum of f over masks within D) / |D|;
    f float[..., M] the load of each copy mask (transformed in place)."""
    M = 1 << G
    idx = np.arange(M)
    for i in range(G):
        has = idx[(idx >> i) & 1 == 1]
        f[..., has] += f[..., has ^ (1 << i)]
    return (f[..., 1:] / pop[1:]).max(axis=-1)


def min_peak(row: np.ndarray, load: np.ndarray, G: int) -> np.ndarray:
    """float64[H]: peak* / mean device load (module docstring) of slot row int[P] under expert
    loads float[H, N] (one row per scenario); 1.0 is a perfect split."""
    load = np.atleast_2d(np.asarray(load, np.float64))
    H, N = load.shape
    if G > MAX_DEVICES:
        raise InputError(f"min_peak: {G} devices; the exact bound is kept to {MAX_DEVICES}")
    m = _masks(row, G, N)
    f = np.zeros((H, 1 << G))
    for h in range(H):
        f[h] = np.bincount(m, load[h], minlength=1 << G)
    mean = np.maximum(load.sum(axis=1) / G, 1e-12)
    return _zeta_peak(f, G, _popcount(G)) / mean


def fill_loads(row: np.ndarray, load: np.ndarray, G: int) -> np.ndarray:
    """float64[H, G]: device loads of a feasible split (module docstring: water-filling) of
    expert loads float[H, N] over slot row int[P]; its max / mean is >= `min_peak`'s."""
    load = np.atleast_2d(np.asarray(load, np.float64))
    H, N = load.shape
    row = np.asarray(row, np.intp)
    on = np.zeros((N, G), bool)
    on[row, np.arange(row.size) // (row.size // G)] = True
    copies = on.sum(axis=1)
    single = copies == 1
    out = load[:, single] @ on[single].astype(np.float64)                # [H, G]
    rep = np.flatnonzero(copies > 1)
    hosts = {int(e): np.flatnonzero(on[e]) for e in rep}
    for e in rep[np.argsort(-load[:, rep].sum(axis=0), kind="stable")]:
        d = hosts[e]
        lv = np.sort(out[:, d], axis=1)                                   # [H, C]
        C = d.size
        t = (load[:, e][:, None] + np.cumsum(lv, axis=1)) / np.arange(1, C + 1)   # [H, C]
        ok = t >= lv                                  # level t_j reaches the j-th lowest load
        j = C - 1 - np.argmax(ok[:, ::-1], axis=1)    # the last j where it does
        level = t[np.arange(H), j]
        out[:, d] = np.maximum(out[:, d], level[:, None])
    return out


def peak_of(row: np.ndarray, load: np.ndarray, G: int) -> np.ndarray:
    """float64[H]: `min_peak` (exact) up to `MAX_DEVICES` devices, else `fill_loads`' max /
    mean (an upper bound)."""
    if G <= MAX_DEVICES:
        return min_peak(row, load, G)
    f = fill_loads(row, load, G)
    return f.max(axis=1) / np.maximum(f.mean(axis=1), 1e-12)


def _candidates(row: np.ndarray, G: int, N: int) -> list[tuple[int, int]]:
    """(slot p, new expert b): every retarget of a slot holding an expert with several copies
    to an expert its device does not hold."""
    S = row.size // G
    cnt = np.bincount(row, minlength=N)
    out = []
    for p in np.flatnonzero(cnt[row] > 1):
        held = set(row[(p // S) * S:(p // S + 1) * S].tolist())
        out += [(int(p), b) for b in range(N) if b not in held]
    return out


def replica_pass(phy2log: np.ndarray, G: int, loads: np.ndarray, caps: np.ndarray,
                 cfg: ReplicaPass = ReplicaPass(), keep: np.ndarray | None = None,
                 tokens: np.ndarray | None = None,
                 slack: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """(new phy2log int32[L, P], slots retargeted): per layer, greedy replica retargets that
    lower max over scenarios h of min_peak_h / caps[h] while it is above 1.

    phy2log int[L, P] (device g owns slots [g S, (g + 1) S)); loads float[L, H, N] expert loads
    per layer and scenario; caps float[H] (>= 1); keep float[L, N] or None: among moves of
    equal worst ratio, the one dropping the copy of least `keep` (locality of the dropped copy)
    and adding the most; tokens int[T, L, k] or None: the rows `cfg.locality` counts local
    activations on (`placement.replica_locality`; the exact bound's path only); slack float[H]
    or None: added to every scenario's cap, `cfg.target`'s included (resampled scenarios that
    stand for traffic not seen get the budget's slack over the fit's)."""
    phy2log = np.array(phy2log, np.int32, copy=True)
    L, P = phy2log.shape
    _, H, N = loads.shape
    caps = np.asarray(caps, np.float64)
    if cfg.target is not None:
        caps = np.full(H, cfg.target)
    if slack is not None:
        caps = caps + np.asarray(slack, np.float64)
    S = P // G
    moved = 0
    pop = _popcount(G) if G <= MAX_DEVICES else None
    for l in range(L):
        w = np.asarray(loads[l], np.float64)
        mean = np.maximum(w.sum(axis=1) / G, 1e-12)
        if G > MAX_DEVICES:
            moved += _fill_pass(phy2log[l], G, w, caps, cfg)
            continue
        if cfg.locality > 0 and tokens is not None:
            inE = token_experts(np.asarray(tokens[:, l]), N)
        for _ in range(cfg.max_moves):
            row = phy2log[l]
            score = float((min_peak(row, w, G) / caps).max())
            if score <= 1.0 and not (cfg.locality_free and tokens is not None):
                break
            cand = _candidates(row, G, N)
            if not cand:
                break
            m = _masks(row, G, N)
            base = np.stack([np.bincount(m, w[h], minlength=1 << G) for h in range(H)])
            F = np.repeat(base[None], len(cand), axis=0)           # [C, H, M]
            c = np.arange(len(cand))
            p = np.array([x[0] for x in cand])
            b = np.array([x[1] for x in cand])
            a = row[p].astype(np.int64)
            d = p // S
            on = np.bincount(np.arange(P) // S * N + row, minlength=G * N)
            twice = on[d * N + a] > 1            # two copies on one device (engines' maps)
            ma = np.where(twice, m[a], m[a] & ~(np.int64(1) << d))   # a keeps its other copies
            mb = m[b] | (np.int64(1) << d)
            for e, old, new in ((a, m[a], ma), (b, m[b], mb)):
                F[c, :, old] -= w[:, e].T
                F[c, :, new] += w[:, e].T
            ratio = (_zeta_peak(F, G, pop) / mean[None] / caps[None]).max(axis=1)   # [C]
            if cfg.locality > 0 and tokens is not None:
                best = _pick_local(ratio, score, local_gain(row, G, inE, p, b), cfg)
            else:
                tie = 0.0 if keep is None else (keep[l, b] - keep[l, a]) * 1e-9
                best = _pick_peak(ratio, score, tie, cfg)
            if best is None:
                break
            phy2log[l, p[best]] = b[best]
            moved += 1
    return phy2log, moved


def _pick_peak(ratio: np.ndarray, score: float, tie, cfg: ReplicaPass) -> int | None:
    """The retarget `replica_pass` makes by default: of the candidates' worst ratios ratio
    float[C], the lowest (`tie`: float[C] or 0, `keep`'s tie-break), or None where it lowers
    the current worst ratio `score` by less than `cfg.min_cut`."""
    best = int(np.argmax(-ratio + tie))
    return None if score - ratio[best] < cfg.min_cut else best


def _pick_local(ratio: np.ndarray, score: float, gain: np.ndarray,
                cfg: ReplicaPass) -> int | None:
    """The retarget with `cfg.locality` (`placement.replica_locality`): among the candidates
    that lower the worst ratio `score` by `cfg.min_cut` and come within `cfg.locality` of the
    lowest ratio float[C], the one of most local activations gained (gain float[C]); where none
    lowers it and `cfg.locality_free`, one that gains locality without raising it; else None."""
    down = (ratio <= score - cfg.min_cut) & (score > 1.0)
    ok = (down & (ratio <= ratio.min() + cfg.locality) if down.any()
          else (ratio <= max(score, 1.0)) & (gain > 0) & cfg.locality_free)
    if not ok.any():
        return None
    return int(np.argmax(np.where(ok, gain - 1e-9 * ratio, -np.inf)))


def _fill_pass(row: np.ndarray, G: int, w: np.ndarray, caps: np.ndarray, cfg: ReplicaPass,
               devices: int = 4, experts: int = 8) -> int:
    """`replica_pass` on one layer above `MAX_DEVICES` (row int32[P] changed in place; slots
    retargeted): the peak by `fill_loads`, candidates the replica slots on the `devices` least
    loaded devices of the worst scenario, retargeted to the `experts` experts of most load per
    copy there."""
    S = row.size // G
    N = w.shape[1]
    moved = 0
    for _ in range(cfg.max_moves):
        f = fill_loads(row, w, G)
        ratio = f.max(axis=1) / np.maximum(f.mean(axis=1), 1e-12) / caps
        h = int(np.argmax(ratio))
        score = float(ratio[h])
        if score <= 1.0:
            break
        cnt = np.bincount(row, minlength=N)
        low = np.argsort(f[h], kind="stable")[:devices]
        hot = np.argsort(-w[h] / np.maximum(cnt, 1), kind="stable")[:experts]
        best, arg = score, None
        for d in low:
            slots = np.arange(d * S, (d + 1) * S)
            held = set(row[slots].tolist())
            for p in slots[cnt[row[slots]] > 1]:
                for b in hot:
                    if int(b) in held:
                        continue
                    new = row.copy()
                    new[p] = b
                    g = fill_loads(new, w, G)
                    r = float((g.max(axis=1) / np.maximum(g.mean(axis=1), 1e-12) / caps).max())
                    if r < best - cfg.min_cut:
                        best, arg = r, (int(p), int(b))
        if arg is None:
            break
        row[arg[0]] = arg[1]
        moved += 1
    return moved
