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
    gain that keep both devices under the cap. dev int64[N] is updated in place and returned.

    Every scan scores all N x N pairs, but a swap of e1 (device d1) and e2 (d2) only changes
    the pairs with an expert on d1 or d2 (a device's robust load after a swap depends on its
    own members alone, a pair's gain on its two experts' devices), so `_Pairs` keeps the
    scores and recomputes those rows and columns alone: about 2 N / G rows and columns, not N,
    by the same expressions, so the result is the full rescan's bit for bit (ours; tested
    against it, tests/placement/sempar/test_sempar_swaps.py)."""
    pairs = _Pairs(W, lm, dev, expert_group)
    for _ in range(max_swaps):
        score = pairs.score()
        if score is None:
            return dev
        i = int(np.argmax(score))
        e1, e2 = divmod(i, dev.size)
        if not np.isfinite(score[e1, e2]):
            return dev
        dev[e1], dev[e2] = dev[e2], dev[e1]
        pairs.swapped(e1, e2)
    return dev


class _Pairs:
    """The swap scores of every expert pair under the current placement dev int64[N] (the
    caller's array, swapped in place between calls): `score()` the matrix float[N, N] to take the
    argmax of (None: no swap cuts the overload), `swapped(e1, e2)` after each swap. Keeps gain,
    validity, both robust loads after the swap (`_block`) and the score,
    and recomputes only the rows and columns of experts on the two devices a swap touched."""

    def __init__(self, W: np.ndarray, lm: LoadModel, dev: np.ndarray, expert_group: np.ndarray):
        self.W, self.lm, self.dev = W, lm, dev
        self.G, self.N = W.shape
        self.same = expert_group[:, None] == expert_group[None, :]
        self.diag = None if lm.sigma is None else np.diag(lm.sigma)
        self.dirty: np.ndarray | None = None          # rows / columns to recompute; None: all
        self.phase: str | None = None                 # "over" or "fit" at the last score

    def swapped(self, e1: int, e2: int) -> None:
        """Mark the pairs a swap of e1 and e2 (now on each other's devices) changed."""
        dev = self.dev
        self.dirty = np.flatnonzero((dev == dev[e1]) | (dev == dev[e2]))

    def _state(self) -> None:
        """Per-device loads (plain, robust) and the load model's device sums, as
        `LoadModel.of` computes them."""
        lm, dev, G = self.lm, self.dev, self.G
        ar = np.arange(self.N)
        self.Lp = np.bincount(dev, weights=lm.load, minlength=G)
        self.own_w = self.W[dev, ar]
        if lm.sigma is None:
            self.Ld = self.Lp
            return
        self.S = lm.by_device(dev, G)                                       # [N, G]
        self.own_s = self.S[ar, dev]
        self.V = np.bincount(dev, weights=self.own_s, minlength=G)
        self.Ld = self.Lp + np.sqrt(np.maximum(self.V, 0.0)) - lm.offset

    def _block(self, r: np.ndarray | None, c: np.ndarray | None) -> tuple:
        """(gain, valid, R1, R2) of the pairs (r x c), r or c None: every expert (one of them
        is): the full scan's expressions, entry by entry (R1 / R2: the robust loads of
        dev[e1] / dev[e2] after swapping e1 in r with e2 in c)."""
        W, dev, lm = self.W, self.dev, self.lm
        da = dev if r is None else dev[r]
        db = dev if c is None else dev[c]
        own_w, load = self.own_w, lm.load
        if r is None:                                  # W[d(e1), e2] and W[d(e2), e1]
            to_b, to_a = _sub2(W, None, c)[dev], W[db].T
        else:
            to_b, to_a = W[da], W[:, r][dev].T
        gain = to_b + to_a - _sub(own_w, r)[:, None] - _sub(own_w, c)[None, :]
        valid = _sub2(self.same, r, c) & (da[:, None] != db[None, :])
        d = _sub(load, c)[None, :] - _sub(load, r)[:, None]                   # e1 -> d2, e2 -> d1
        L1, L2 = self.Lp[da][:, None] + d, self.Lp[db][None, :] - d
        if lm.sigma is None:
            return gain, valid, L1, L2
        S, V, own, diag = self.S, self.V, self.own_s, self.diag
        Sg = _sub2(lm.sigma, r, c)
        if r is None:                                  # S[e2, d(e1)] and S[e1, d(e2)]
            s_ba, s_ab = _sub(S, c)[:, dev].T, S[:, db]
        else:
            s_ba, s_ab = S[:, da].T, S[r][:, dev]
        own_a, own_b, diag_a, diag_b = _sub(own, r), _sub(own, c), _sub(diag, r), _sub(diag, c)
        V1 = (V[da][:, None] - 2 * own_a[:, None] + diag_a[:, None] + 2 * s_ba
              - 2 * Sg + diag_b[None, :])
        V2 = (V[db][None, :] - 2 * own_b[None, :] + diag_b[None, :] + 2 * s_ab
              - 2 * Sg + diag_a[:, None])
        return (gain, valid, L1 + np.sqrt(np.maximum(V1, 0.0)) - lm.offset,
                L2 + np.sqrt(np.maximum(V2, 0.0)) - lm.offset)

    def _score(self, r: np.ndarray | None, c: np.ndarray | None, over: np.ndarray | None,
               part: tuple) -> tuple:
        """(score, cut or None) of the pairs (r x c) from `_block`'s part; over: the
        devices' overload above the cap (the overload phase) or None."""
        gain, valid, R1, R2 = part
        cap = self.lm.cap
        if over is None:
            return np.where(valid & (R1 <= cap) & (R2 <= cap) & (gain > 1e-9), gain,
                            -np.inf), None
        o_old = over[_sub(self.dev, r)][:, None] + over[_sub(self.dev, c)][None, :]
        o_new = np.maximum(R1 - cap, 0.0) + np.maximum(R2 - cap, 0.0)
        cut = np.where(valid, o_old - o_new, 0.0)
        return np.where(cut > 1e-9, gain / 1e6 + cut, -np.inf), cut

    def score(self) -> np.ndarray | None:
        """float[N, N]: the score of swapping (e1, e2): while some device is over the cap, the
        overload cut (plus the gain / 1e6) where it cuts; else the gain where both devices stay
        under the cap and it gains; -inf elsewhere. None: overloaded, and no swap cuts it."""
        self._state()
        over = np.maximum(self.Ld - self.lm.cap, 0.0)
        phase = "over" if over.sum() > 1e-9 else "fit"
        ov = over if phase == "over" else None
        if self.dirty is None:
            self.part = self._block(None, None)
            self.sc, self.cut = self._score(None, None, ov, self.part)
        else:
            A, same_phase = self.dirty, phase == self.phase
            for r, c in ((A, None), (None, A)):         # the rows, then the columns, of A
                part = self._block(r, c)
                for full, new in zip(self.part, part):
                    _put(full, r, c, new)
                if same_phase:
                    s, cut = self._score(r, c, ov, part)
                    _put(self.sc, r, c, s)
                    if cut is not None:
                        _put(self.cut, r, c, cut)
            if not same_phase:
                self.sc, self.cut = self._score(None, None, ov, self.part)
        self.phase, self.dirty = phase, None
        if phase == "over" and self.cut.max() <= 1e-9:
            return None
        return self.sc


def _sub(x: np.ndarray, i: np.ndarray | None) -> np.ndarray:
    """x[i] (x itself for i None)."""
    return x if i is None else x[i]


def _sub2(M: np.ndarray, r: np.ndarray | None, c: np.ndarray | None) -> np.ndarray:
    """M's rows r (None: all) and columns c (None: all)."""
    if r is None:
        return M if c is None else M[:, c]
    return M[r] if c is None else M[np.ix_(r, c)]


def _put(M: np.ndarray, r: np.ndarray | None, c: np.ndarray | None, x: np.ndarray) -> None:
    """M's rows r or columns c (the other None) set to x."""
    if r is None:
        M[:, c] = x
    else:
        M[r] = x
