"""A last pass of expert swaps scored on the optimal-home LAR (ours; `sempar-exact-refine`).

`sempar`'s moves (placement/sempar/solver.py) and the integer configuration program
(config_ilp.py) both optimise stand-ins for the real tp figure: the former the greedy homes of its
token step on a row sample, the latter each device's best rows counted alone. This pass scores
the figure itself: the capacity-bound exact-home local activations of one layer on its whole fit
trace, every 2,048-token batch homed by the optimal assignment within equal shares
(`capacity.ASSIGN_RULES["optimal"]`, `transport.transport_counts`), and swaps two experts on
different devices (every device keeps its N / G experts) while that figure rises and the
caller's balance rule admits the swap.

Cheap because of two facts of the figure:
- a row's hits on the G devices are determined by key = sum over its experts of (k + 1)^device
  (digits of base k + 1 never carry), and a swap of experts a (device g) and b (device h)
  changes the key only of the rows holding a or b, by +-((k + 1)^h - (k + 1)^g);
- rows of one key are interchangeable in the transportation problem, so a batch's optimum is a
  transportation problem on its at most C(G + k - 1, k) distinct keys (35 at G = 4, k = 4).
A surrogate ranks the candidate swaps first: the same optimum with the whole trace as one batch
(caps T / G each; one transportation problem on the distinct keys). The best-ranked swaps (gain
or not: the surrogate misses what the batches' own shares do) are then tried in that order on
the exact figure (every batch) and kept where it rises; the scan repeats until a scan keeps
none or `RefineConfig.scans` scans are done (deterministic; a wall-clock cap aside). Measured on GPT-OSS-20B (one
layer, 152k rows, 2026-12-07, load about 1.5): surrogate 0.5-1.5 ms, exact figure 0.03 s (EP 4)
and 0.07-0.14 s (EP 8) a swap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import combinations_with_replacement
from typing import Callable

import numpy as np

from sempar.placement.capacity import BATCH, equal_shares
from sempar.placement.transport import transport_counts


@dataclass(frozen=True)
class RefineConfig:
    """Knobs of the swap pass.

    scans: scans a layer at most (each ranks every admitted swap, then tries the best);
    tries: exact tries a scan, the surrogate's best-ranked swaps first (scans and tries make
        the pass deterministic: the same placement on any machine);
    budget_s: a safety cap in wall seconds a layer (the pass stops at the first scan boundary
        or exact try past it; the figure never falls, so stopping early only leaves gain
        unclaimed; the default is not reached on GPT-OSS-20B);
    batch: the tp batch of the figure's equal shares (docs/design.md's 2,048);
    max_keys: the pass runs where (k + 1)^G, the key table's size, is at most this."""

    scans: int = 6
    tries: int = 48
    budget_s: float = 120.0
    batch: int = BATCH
    max_keys: int = 1 << 23


class LayerHomes:
    """One layer's rows and their optimal-home figure under any expert-to-device map.

    experts: int[T, k] the layer's routed experts (distinct within a row), N experts, G
    devices. `keys(dev)` int64[T] each row's hit key under dev int[N]; `exact(keys)` the
    local activations of every batch homed optimally within equal shares; `whole(keys)` the
    surrogate (the whole trace as one batch)."""

    def __init__(self, experts: np.ndarray, N: int, G: int, batch: int = BATCH):
        ex = np.asarray(experts, np.int64)
        self.T, self.k = ex.shape
        self.N, self.G = N, G
        self.pw = (self.k + 1) ** np.arange(G, dtype=np.int64)
        combos = np.array(list(combinations_with_replacement(range(G), self.k)), np.int64)
        keys = self.pw[combos].sum(axis=1)
        self.types = np.stack([np.bincount(c, minlength=G) for c in combos])       # [R, G]
        self.index = np.full(int(self.pw[-1]) * (self.k + 1), -1, np.int64)
        self.index[keys] = np.arange(len(keys))
        self.R = len(keys)
        self.ex = ex
        rows = np.repeat(np.arange(self.T), self.k)
        order = np.argsort(ex.ravel(), kind="stable")
        bounds = np.searchsorted(ex.ravel()[order], np.arange(N + 1))
        self.rows_of = [rows[order[bounds[e]:bounds[e + 1]]] for e in range(N)]
        step = self.T if batch is None or batch >= self.T else batch
        self.batch_id = np.arange(self.T) // max(step, 1)
        self.nb = int(self.batch_id[-1]) + 1 if self.T else 0
        sizes = np.bincount(self.batch_id, minlength=self.nb)
        self.caps = [equal_shares(int(n), G) for n in sizes]
        self.whole_caps = equal_shares(self.T, G)

    def keys(self, dev: np.ndarray) -> np.ndarray:
        """int64[T]: each row's hit key under dev int[N] (expert -> device)."""
        return self.pw[np.asarray(dev, np.int64)[self.ex]].sum(axis=1)

    def swapped(self, keys: np.ndarray, a: int, b: int, g: int, h: int) -> np.ndarray:
        """keys after swapping expert a (on device g) with b (on h); a copy."""
        out = keys.copy()
        d = self.pw[h] - self.pw[g]
        np.add.at(out, self.rows_of[a], d)
        np.add.at(out, self.rows_of[b], -d)
        return out

    def _value(self, count: np.ndarray, caps: np.ndarray) -> int:
        nz = np.flatnonzero(count)
        x = transport_counts(self.types[nz], count[nz], caps)
        return int((x * self.types[nz]).sum())

    def exact(self, keys: np.ndarray) -> int:
        """The local activations of the layer, every batch homed optimally in equal shares."""
        idx = self.index[keys]
        counts = np.bincount(self.batch_id * self.R + idx,
                             minlength=self.nb * self.R).reshape(self.nb, self.R)
        return sum(self._value(counts[b], self.caps[b]) for b in range(self.nb))

    def whole(self, keys: np.ndarray) -> int:
        """The surrogate: the optimum with the whole trace as one batch (caps T / G)."""
        return self._value(np.bincount(self.index[keys], minlength=self.R), self.whole_caps)


def fits(N: int, G: int, k: int, config: RefineConfig = RefineConfig()) -> bool:
    """Whether the key table of k experts a row on G devices is small enough for the pass."""
    return G > 1 and N % G == 0 and (k + 1) ** G <= config.max_keys


def refine_layer(layer: LayerHomes, dev: np.ndarray,
                 admit: Callable[[np.ndarray, int, int], bool],
                 config: RefineConfig = RefineConfig(), seed: int = 0) -> tuple[np.ndarray, dict]:
    """(dev int64[N] after the pass, {"before", "after": the exact figure's local activations,
    "swaps": kept, "tries": exact tries, "seconds"}) from dev int[N] (expert -> device, N / G
    experts each); admit(new_dev, g, h): whether the caller's balance rule allows new_dev, in
    which devices g and h changed. The figure after is never below the one before."""
    t0 = time.perf_counter()
    dev = np.asarray(dev, np.int64).copy()
    keys = layer.keys(dev)
    before = best = layer.exact(keys)
    surr = layer.whole(keys)
    rng = np.random.default_rng(seed)
    swaps = tries = scans = 0
    gained = True
    while gained and scans < config.scans and time.perf_counter() - t0 < config.budget_s:
        gained = False
        scans += 1
        ranked = []
        pairs = [(a, b) for a in range(layer.N) for b in range(a + 1, layer.N) if dev[a] != dev[b]]
        for i in rng.permutation(len(pairs)):
            a, b = pairs[i]
            g, h = int(dev[a]), int(dev[b])
            new = dev.copy()
            new[a], new[b] = h, g
            if admit(new, g, h):             # only the swaps the rule allows are ranked
                ranked.append((layer.whole(layer.swapped(keys, a, b, g, h)) - surr, a, b))
        ranked.sort(key=lambda r: -r[0])
        for _, a, b in ranked[:config.tries]:
            if time.perf_counter() - t0 >= config.budget_s:
                break
            g, h = int(dev[a]), int(dev[b])
            if g == h:
                continue
            new = dev.copy()
            new[a], new[b] = h, g
            if not admit(new, g, h):         # an earlier swap of this scan moved its devices
                continue
            k2 = layer.swapped(keys, a, b, g, h)
            tries += 1
            v = layer.exact(k2)
            if v > best:
                dev, keys, best, swaps, gained = new, k2, v, swaps + 1, True
        surr = layer.whole(keys)
    return dev, {"before": before, "after": best, "swaps": swaps, "tries": tries, "scans": scans,
                 "seconds": round(time.perf_counter() - t0, 2)}
