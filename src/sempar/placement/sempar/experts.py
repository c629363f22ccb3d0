"""The expert step of the `sempar` solver (placement/sempar/solver.py): each expert to a
device, given where the tokens (requests) are, maximising local activations under the load cap.

A min-cost assignment of experts to slots (Hungarian, `scipy.optimize.linear_sum_assignment`)
with Lagrangian load prices, then pairwise swaps with exact gain (module functions' docstrings).
Shapes: N experts, G devices, S = N / G slots per device.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from sempar.placement.sempar.load import LoadModel


def expert_step(W: np.ndarray, lm: LoadModel, slot_group: np.ndarray,
                expert_group: np.ndarray, start: np.ndarray | None, *, price_steps: int,
                swap_limit: int, polish: int | None = None,
                max_swaps: int | None = None) -> np.ndarray:
    """int64[N]: device of each expert maximising sum W[dev[e], e] under the load cap.

    W float[G, N]: activations of e by the items on d; lm: the experts' loads and the cap;
    slot_group int[G, S]: expert group of each slot (S = N/G); expert_group int[N]. `start` (a
    placement, feasible or not) competes with the Hungarian solutions. Then swaps (module
    docstring). `price_steps` Hungarian solves (Lagrangian load price updates); `polish`: only
    that many best candidates (by overload, then affinity) get swaps, None every candidate;
    `max_swaps` swaps each, at most, None `swap_limit` x N (the bounds: `scale.expert_bounds`).
    """
    G, N = W.shape
    S = N // G
    load, cap = lm.load, lm.cap
    dev_of_slot = np.repeat(np.arange(G), S)
    forbid = slot_group.reshape(-1)[None, :] != expert_group[:, None]            # [N, G*S]
    scale = max(float(load.mean()), 1e-12)
    mu = np.zeros(G)
    cands = [] if start is None else [np.asarray(start, np.int64)]
    step = 0.5 * float(W.max()) / scale
    for it in range(price_steps):
        cost = -(W - mu[:, None] * load[None, :])[dev_of_slot].T                   # [N, G*S]
        cost = np.where(forbid, 1e18, cost)
        _, col = linear_sum_assignment(cost)
        dev = dev_of_slot[col]
        cands.append(dev)
        L = lm.of(dev, G)
        if L.max() <= cap and not mu.any():
            break
        mu = np.maximum(0.0, mu + step * (L - cap) / scale)
        step *= 0.85
    def key(dev: np.ndarray) -> tuple[float, float]:
        return (max(0.0, lm.of(dev, G).max() - cap), -W[dev, np.arange(N)].sum())

    if polish is not None:
        cands = sorted(cands, key=key)[:polish]
    best = None
    seen: set[bytes] = set()
    for dev in cands:
        if dev.tobytes() in seen:   # price steps often repeat a solution: same search, same key
            continue
        seen.add(dev.tobytes())
        dev = _swap_search(W, lm, dev.copy(), expert_group,
                           swap_limit * N if max_swaps is None else max_swaps)
        k = key(dev)
        if best is None or k < best[0]:
            best = (k, dev)
    return best[1]


def _swap_search(W: np.ndarray, lm: LoadModel, dev: np.ndarray,
                 expert_group: np.ndarray, max_swaps: int) -> np.ndarray:
    """Pairwise expert swaps between devices, at most `max_swaps`: first those that cut the
    total overload above the cap (least affinity lost), then best-improvement swaps with exact
    gain that keep both devices under the cap. dev int64[N] is updated in place and returned."""
    G, N = W.shape
    cap = lm.cap
    ar = np.arange(N)
    same = expert_group[:, None] == expert_group[None, :]
    for _ in range(max_swaps):
        L = lm.of(dev, G)
        own = W[dev, ar]                                                 # [N]
        cross = W[dev][:, ar]                                            # [e2, e1]: W[d(e2), e1]
        gain = cross + cross.T - own[:, None] - own[None, :]             # [e1, e2]
        L1, L2 = lm.swapped(dev, G)
        valid = same & (dev[:, None] != dev[None, :])
        over = np.maximum(L - cap, 0.0)
        if over.sum() > 1e-9:
            o_old = over[dev][:, None] + over[dev][None, :]
            o_new = np.maximum(L1 - cap, 0.0) + np.maximum(L2 - cap, 0.0)
            cut = np.where(valid, o_old - o_new, 0.0)
            if cut.max() <= 1e-9:
                return dev
            score = np.where(cut > 1e-9, gain / 1e6 + cut, -np.inf)
        else:
            score = np.where(valid & (L1 <= cap) & (L2 <= cap) & (gain > 1e-9), gain, -np.inf)
        i = int(np.argmax(score))
        e1, e2 = divmod(i, N)
        if not np.isfinite(score[e1, e2]):
            return dev
        dev[e1], dev[e2] = dev[e2], dev[e1]
    return dev

