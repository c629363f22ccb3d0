"""Spatiotemporal trajectory scheduling (FSE-DP §V-A, Algorithm 1) with idle-chiplet bit vectors.

Pieces the engines share:

- `unit_order`: line 1 of Alg. 1, "sort E by paired-load policy" (§IV-A): experts sorted by token
  count and paired from opposite ends, hot_1, cold_1, hot_2, cold_2, ... With paired-load off (A2)
  the list is the active experts in id order, one expert per scheduling unit.
- `visit_table`: the trajectory T_e of an expert is the ring (§VI-A: a logical ring, next-hop
  forwarding) over the dies that hold its tokens, entered at the die that received the micro-slice.
- `IdleVector`: the ICV register of §V-B; allocation is AND-NOT with a trajectory mask, release is
  OR with a completion mask.
- `alg1_schedule`: a scalar event-driven reference of Alg. 1 at expert granularity (used by tests and
  to cross-check the vectorised engine): experts are dispatched in priority order to the first idle
  chiplet of their trajectory, each chiplet runs one expert at a time.

In the vectorised engine (flow.py) a chiplet returns to the idle set when it has finished its part
of every running expert (our reading of line 15 at chiplet granularity), so Alg. 1's dispatch is the
priority order plus per-die list scheduling: a later expert starts at once on dies the earlier ones
do not use, which is the effect of the skip-ahead in lines 4-10.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sempar.chiplet.hardware import mesh_of


def unit_order(totals: np.ndarray, paired: bool) -> tuple[np.ndarray, int]:
    """Priority list of experts per instance and the unit width.

    totals: int[B, E] tokens per expert. Returns (order int64[B, E], width): active experts first
    (hot/cold pairs when `paired`, width 2; id order otherwise, width 1), inactive ones after.
    """
    B, E = totals.shape
    if not paired:
        key = np.where(totals > 0, 0, 1)
        return np.argsort(key, axis=1, kind="stable"), 1
    desc = np.argsort(-totals, axis=1, kind="stable")          # hot first, zeros at the end
    n_act = (totals > 0).sum(axis=1)
    order = np.empty_like(desc)
    # slot 2i <- i-th hottest, slot 2i+1 <- i-th coldest among the active ones
    for b in range(B):   # E <= a few hundred; cheap index arithmetic per instance
        a = int(n_act[b])
        hot = desc[b, :(a + 1) // 2]
        cold = desc[b, (a + 1) // 2:a][::-1]
        seq = np.empty(a, np.int64)
        seq[0::2] = hot
        seq[1::2] = cold
        order[b, :a] = seq
        order[b, a:] = desc[b, a:]
    return order, 2


@lru_cache(maxsize=None)
def visit_table(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ring trajectories of every (entry die, die mask) on an R x C mesh.

    Returns (vis int8[D, 2^D, D], nv int8[D, 2^D], hop int8[D, 2^D, D]): the v-th die visited
    when a micro-slice enters at die a with trajectory mask m (-1 past the end), the number of
    visits, and the hops from the previous position (the entry die for v = 0).
    """
    mesh = mesh_of(rows, cols)
    D = mesh.dies
    masks = np.arange(1 << D, dtype=np.int64)
    vis = np.full((D, 1 << D, D), -1, np.int8)
    hop = np.zeros((D, 1 << D, D), np.int8)
    nv = np.zeros((D, 1 << D), np.int8)
    for a in range(D):
        prev = np.full(masks.size, a)
        cnt = np.zeros(masks.size, np.int64)
        for r in range(D):
            die = mesh.ring[(mesh.ring_pos[a] + r) % D]
            inc = ((masks >> die) & 1).astype(bool)
            sel = np.flatnonzero(inc)
            vis[a, sel, cnt[sel]] = die
            hop[a, sel, cnt[sel]] = mesh.hops[prev[sel], die]
            prev[sel] = die
            cnt[sel] += 1
        nv[a] = cnt
    return vis, nv, hop


class IdleVector:
    """Idle Chiplet Vector (§V-B): an N-bit register of idle chiplets."""

    def __init__(self, dies: int):
        self.dies = dies
        self.bits = (1 << dies) - 1

    def allocate(self, mask: int) -> None:          # AND-NOT with the trajectory pattern
        self.bits &= ~mask

    def release(self, mask: int) -> None:           # OR with the completion mask
        self.bits |= mask

    def intersects(self, mask: int) -> bool:
        return bool(self.bits & mask)

    def first(self, mask: int) -> int:
        both = self.bits & mask
        return (both & -both).bit_length() - 1


@dataclass
class Dispatch:
    expert: int
    entry: int          # c*
    start: float
    end: float
    mask: int


def alg1_schedule(masks: list[int], durations: list[float], dies: int) -> list[Dispatch]:
    """Scalar reference of Alg. 1 at expert granularity.

    masks[e]: trajectory bit mask of expert e (in priority order); durations[e]: time it keeps its
    chiplets busy. At each event the first expert in priority order whose trajectory meets the idle
    vector is dispatched (lines 4-10), its chiplets are allocated (line 8) and released when it
    completes (line 15). Returns dispatches in time order; no chiplet ever runs two experts at once.
    """
    icv = IdleVector(dies)
    pending = list(range(len(masks)))
    running: list[Dispatch] = []
    done: list[Dispatch] = []
    t = 0.0
    while pending:
        progressed = False
        for i, e in enumerate(pending):
            busy = 0
            for r in running:
                busy |= r.mask
            free_part = masks[e] & ~busy
            if masks[e] and icv.intersects(free_part):
                c = icv.first(free_part)
                d = Dispatch(e, c, t, t + durations[e], free_part)
                icv.allocate(free_part)
                running.append(d)
                pending.pop(i)
                progressed = True
                break
            if not masks[e]:
                pending.pop(i)
                progressed = True
                break
        if progressed:
            continue
        if not running:
            break
        nxt = min(running, key=lambda r: r.end)      # line 15: an expert completes
        t = nxt.end
        running.remove(nxt)
        icv.release(nxt.mask)
        done.append(nxt)
    done.extend(sorted(running, key=lambda r: r.end))
    return sorted(done, key=lambda d: d.start)
