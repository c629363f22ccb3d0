"""FSE-DP micro-slice flow engine (§IV, Rules 1-5, Figs. 4, 6, 7) driven by Alg. 1's order.

One call simulates B independent MoE-layer instances at once (numpy over B): expert weights are
split into M micro-slices (§IV-C's single-level notation); each micro-slice is loaded from DDR into
one die's buffer and then streams along the expert's ring trajectory (trajectory.py) through every
die that holds tokens of that expert, is computed there on the local tokens and is released after
the last visit. Resources per die: one DDR channel, one compute array, one egress queue per mesh
neighbour pair, and a buffer of S = buffer_bytes // micro_slice_bytes micro-slice slots (a slot is
taken when the micro-slice starts arriving and freed when it has been computed and forwarded).

- Rule 1: a micro-slice that arrives is forwarded at once (eager, Fig. 4(b)) while it is computed;
  its slot is freed when both are done.
- Rule 2: a die computes whatever micro-slice it holds, in priority order (list scheduling).
- Rule 3: after the last die of the trajectory the slot is released.
- Rule 4: every die loads the next micro-slice of the priority list as soon as its DDR channel and
  buffer allow (pull): the micro-slice goes to the die whose channel and next slot free first,
  trajectory dies preferred on ties; the first micro-slice of a unit enters at Alg. 1's c*.
- Rule 5 (optional): the DDR channel that frees first streams the micro-slice straight into the
  trajectory die with the most free slots (ours: the IO-die DDR controller can deliver any
  channel's data to any die; without Rule 5 it lands in the buffer of the die that pulled it).

Times are list-scheduled (each resource keeps its next free time; a task starts when its inputs and
its resources are ready), so an instance costs O(experts x M x visits) steps; the kernel is compiled
with numba (cached on disk). Peak buffer occupancy (slots held at once) is tracked per die.

On-chip memory of one instance (simulate.py adds the tokens; W = expert_params x weight_bytes,
a = d_model x act_bytes, n tokens):

- weights: the largest number of micro-slice slots each die held at once, summed over the dies,
  x W / M (`peak_slots` x `slot_bytes`); at most S = buffer_bytes // (W / M) per die, and Rule 4
  fills free slots, so a DDR-bound instance reaches S on every die. Only one physical copy of a
  micro-slice exists in the package (§I: "only one physical copy of any token/expert slice"): a
  forwarded micro-slice takes a slot on the next die and frees its slot on the sender once sent;
  a slot counts as held from the start of the transfer into it (a conservative bound, ours);
- tokens: one copy of the n inputs and one of the n outputs on their home dies (2 n a), no
  replication: the weights travel, the tokens stay (§III Fig. 3(a), §IV-C "no longer needs token
  redistribution").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from sempar.chiplet.hardware import ChipletConfig
from sempar.chiplet.trajectory import unit_order, visit_table
from sempar.errors import InputError


@dataclass
class FlowResult:
    """Per-instance results: latency float64[B], compute busy float64[B, D], ddr busy, d2d bytes,
    peak weight slots per die int64[P, D] for the sampled instances `peak_of` int64[P], and the
    activity of the snapshot instance (lists of (kind, die, start, end, expert))."""

    latency: np.ndarray
    busy: np.ndarray
    ddr_busy: np.ndarray
    d2d_bytes: np.ndarray
    peak_slots: np.ndarray
    peak_of: np.ndarray
    slot_bytes: float
    activity: list = field(default_factory=list)


def auto_micro_slices(cfg: ChipletConfig, expert_bytes: float, min_slots: int = 8) -> int:
    """Default micro-slice count (ours): 8 (§VI-D: "a micro-slice number below 10 is preferred"),
    doubled until the buffer holds `min_slots` micro-slices (large experts such as Phi-3.5's; §VI-D:
    their latency is governed by the buffer, Fig. 17(a))."""
    m = 8
    while cfg.buffer_bytes // (expert_bytes / m) < min_slots and m < 1024:
        m *= 2
    return m


def micro_slice_slots(cfg: ChipletConfig, expert_bytes: float, micro_slices: int) -> int:
    """Buffer slots per die; InputError when fewer than two micro-slices fit (one computing, one
    arriving: the minimum for Rule 1)."""
    if micro_slices < 1:
        raise InputError(f"--micro-slices: {micro_slices} must be at least 1")
    slots = int(cfg.buffer_bytes // (expert_bytes / micro_slices))
    if slots < 2:
        raise InputError(f"buffer {cfg.buffer_bytes / 2**20:.1f} MiB per die holds {slots} micro-slice(s) "
                         f"of {expert_bytes / micro_slices / 2**20:.2f} MiB; raise --buffer-mb or "
                         f"--micro-slices")
    return slots


def _jit(fn):
    """numba-compile with an on-disk cache; without one where no cache folder is writable."""
    try:
        return njit(cache=True)(fn)
    except RuntimeError:  # pragma: no cover - read-only install without a user cache
        return njit(fn)


def simulate_flow(counts: np.ndarray, cfg: ChipletConfig, expert_params: int, weight_bytes: float,
                  micro_slices: int = 8, paired: bool = False, rule5: bool = False,
                  snapshot: int | None = None) -> FlowResult:
    """Simulate FSE-DP (A2 / A3 / A4) on instances with counts int[B, E, D] (tokens of expert e
    homed on die d). `weight_bytes` is bytes per weight."""
    B, E, D = counts.shape
    if D != cfg.dies:
        raise ValueError("counts and config disagree on the die count")
    M = int(micro_slices)
    ms_bytes = expert_params * weight_bytes / M
    S = micro_slice_slots(cfg, expert_params * weight_bytes, M)
    vis_t, nv_t, hop_t = visit_table(cfg.rows, cfg.cols)
    totals = counts.sum(axis=2)
    order, width = unit_order(totals, paired)
    bits = (1 << np.arange(D, dtype=np.int64))
    masks = ((counts > 0) * bits).sum(axis=2).astype(np.int64)          # int64[B, E]
    passes = (-(-counts // cfg.lanes)).astype(np.int32)                 # ceil(n / lanes)
    n_act = (totals > 0).sum(axis=1).astype(np.int64)
    latency = np.zeros(B)
    busy = np.zeros((B, D))
    ddr_busy = np.zeros((B, D))
    d2d = np.zeros(B)
    peak = np.zeros((B, D), np.int64)
    snap = -1 if snapshot is None else int(snapshot)
    cap = E * M * (2 * D + 1) if snap >= 0 else 1
    rec_i = np.zeros((cap, 3), np.int64)          # kind (0 ddr, 1 d2d, 2 compute), die, expert
    rec_t = np.zeros((cap, 2))
    n = _kernel(passes, masks, order.astype(np.int64), n_act, width, M, S,
                ms_bytes / cfg.ddr_bw_per_die + cfg.xfer_overhead_s, cfg.ddr_latency_s,
                ms_bytes / cfg.d2d_bw + cfg.xfer_overhead_s,
                cfg.fdi_latency_s + cfg.hop_latency_s, 2.0 * cfg.lanes * (expert_params / M) / cfg.peak_ops,
                cfg.ctrl_overhead_s, rule5, vis_t, nv_t, hop_t, snap, ms_bytes,
                latency, busy, ddr_busy, d2d, peak, rec_i, rec_t)
    kinds = ("ddr", "d2d", "compute")
    activity = [(kinds[rec_i[i, 0]], int(rec_i[i, 1]), float(rec_t[i, 0]), float(rec_t[i, 1]), int(rec_i[i, 2]))
                for i in range(n)]
    return FlowResult(latency, busy, ddr_busy, d2d, peak, np.arange(B), ms_bytes, activity)


@_jit
def _argmin_slot(row):
    best, k = row[0], 0
    for i in range(1, row.size):
        if row[i] < best:
            best, k = row[i], i
    return k


@_jit
def _held(row, t):
    c = 0
    for i in range(row.size):
        if row[i] > t:
            c += 1
    return c


@_jit
def _kernel(passes, masks, order, n_act, width, M, S, t_load, ddr_lat, t_xfer, lat, t_pass, ctrl,
            rule5, vis_t, nv_t, hop_t, snap, ms_bytes, latency, busy, ddr_busy, d2d, peak, rec_i, rec_t):
    B, E, D = passes.shape
    n_rec = 0
    inf = np.inf
    for b in range(B):
        ddr_free = np.zeros(D)
        comp_free = np.zeros(D)
        link_free = np.zeros((D, D))
        slot_rel = np.zeros((D, S))
        done = 0.0
        units = (n_act[b] + width - 1) // width
        for u in range(units):
            umask = 0
            for w in range(width):
                p = u * width + w
                if p < E:
                    umask |= masks[b, order[b, p]]
            cstar = -1                     # Alg. 1: first idle chiplet of the unit's trajectory
            best = inf
            for d in range(D):
                if (umask >> d) & 1 and comp_free[d] < best:
                    best = comp_free[d]
                    cstar = d
            for j in range(width * M):
                p = u * width + j % width
                if p >= E:
                    continue
                e = order[b, p]
                m = masks[b, e]
                if m == 0:
                    continue
                if rule5:
                    ch = 0
                    for d in range(1, D):
                        if ddr_free[d] < ddr_free[ch]:
                            ch = d
                    t_ch = ddr_free[ch]
                    a = -1
                    best = -inf
                    for d in range(D):
                        if (m >> d) & 1:
                            free = 0
                            smin = inf
                            for k in range(S):
                                if slot_rel[d, k] <= t_ch:
                                    free += 1
                                if slot_rel[d, k] < smin:
                                    smin = slot_rel[d, k]
                            score = free - smin * 1e-3
                            if score > best:
                                best = score
                                a = d
                else:
                    a = -1
                    best = inf
                    for d in range(D):
                        smin = inf
                        for k in range(S):
                            if slot_rel[d, k] < smin:
                                smin = slot_rel[d, k]
                        r = max(ddr_free[d], smin)
                        if not (m >> d) & 1:
                            r += 1e-15
                        if r < best:
                            best = r
                            a = d
                    if j < width and cstar >= 0 and (m >> cstar) & 1:   # Alg. 1 line 7
                        a = cstar
                    ch = a
                si = _argmin_slot(slot_rel[a])
                t0 = max(ddr_free[ch], slot_rel[a, si])
                slot_rel[a, si] = inf
                occ = _held(slot_rel[a], t0)
                if occ > peak[b, a]:
                    peak[b, a] = occ
                t_arr = t0 + t_load + ddr_lat
                ddr_free[ch] = t0 + t_load
                ddr_busy[b, ch] += t_load
                if b == snap:
                    rec_i[n_rec, 0] = 0; rec_i[n_rec, 1] = ch; rec_i[n_rec, 2] = e
                    rec_t[n_rec, 0] = t0; rec_t[n_rec, 1] = t0 + t_load
                    n_rec += 1
                cur = a
                cur_si = si
                here = t_arr
                cur_done = t_arr
                for v in range(nv_t[a, m]):
                    d = vis_t[a, m, v]
                    if d != cur:
                        si2 = _argmin_slot(slot_rel[d])
                        s0 = max(here, link_free[cur, d], slot_rel[d, si2])
                        hops = hop_t[a, m, v]
                        link_free[cur, d] = s0 + t_xfer
                        slot_rel[d, si2] = inf
                        occ = _held(slot_rel[d], s0)
                        if occ > peak[b, d]:
                            peak[b, d] = occ
                        slot_rel[cur, cur_si] = max(cur_done, s0 + t_xfer)
                        d2d[b] += ms_bytes * max(hops, 1)
                        if b == snap:
                            rec_i[n_rec, 0] = 1; rec_i[n_rec, 1] = cur; rec_i[n_rec, 2] = e
                            rec_t[n_rec, 0] = s0; rec_t[n_rec, 1] = s0 + t_xfer
                            n_rec += 1
                        here = s0 + t_xfer + hops * lat
                        cur_si = si2
                        cur = d
                    dur = passes[b, e, d] * t_pass + ctrl           # Rules 1-2: compute local tokens
                    c0 = max(here, comp_free[d])
                    c1 = c0 + dur
                    comp_free[d] = c1
                    busy[b, d] += dur
                    cur_done = c1
                    if c1 > done:
                        done = c1
                    if b == snap:
                        rec_i[n_rec, 0] = 2; rec_i[n_rec, 1] = d; rec_i[n_rec, 2] = e
                        rec_t[n_rec, 0] = c0; rec_t[n_rec, 1] = c1
                        n_rec += 1
                slot_rel[cur, cur_si] = cur_done                    # Rule 3
        latency[b] = done
    return n_rec
