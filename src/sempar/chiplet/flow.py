"""FSE-DP micro-slice flow engine (§IV, Rules 1-5, Figs. 4, 6, 7) driven by Alg. 1's order.

One call simulates B independent MoE-layer instances at once (numpy over B): expert weights are
split into M micro-slices (§IV-C's single-level notation); each micro-slice is loaded from DDR into
one die's buffer and then streams along the expert's ring trajectory (trajectory.py) through every
die that holds tokens of that expert, is computed there on the local tokens and is released after
the last visit. Resources per die: one DDR channel, one compute array, one egress queue per mesh
neighbour pair, and a micro-slice ring buffer of S = buffer_bytes // micro_slice_bytes slots (§IV:
"a micro-slice-based ring buffer").

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
its resources are ready), so an instance costs O(experts x M x visits) vector steps over B.
Peak buffer occupancy is tracked exactly on a sample of instances (`peak_of`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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


def simulate_flow(counts: np.ndarray, cfg: ChipletConfig, expert_params: int, weight_bytes: float,
                  micro_slices: int = 8, paired: bool = False, rule5: bool = False,
                  snapshot: int | None = None, peak_sample: int = 64) -> FlowResult:
    """Simulate FSE-DP (A2 / A3 / A4) on instances with counts int[B, E, D] (tokens of expert e
    homed on die d). `weight_bytes` is bytes per weight."""
    B, E, D = counts.shape
    if D != cfg.dies:
        raise ValueError("counts and config disagree on the die count")
    M = int(micro_slices)
    ms_bytes = expert_params * weight_bytes / M
    S = micro_slice_slots(cfg, expert_params * weight_bytes, M)
    t_load = ms_bytes / cfg.ddr_bw_per_die
    t_xfer = ms_bytes / cfg.d2d_bw
    lat = cfg.fdi_latency_s + cfg.hop_latency_s
    t_pass = 2.0 * cfg.lanes * (expert_params / M) / cfg.peak_ops
    vis_t, nv_t, hop_t = visit_table(cfg.rows, cfg.cols)
    vis_t = vis_t.astype(np.int64)
    hop_t = hop_t.astype(np.float64)
    nv_t = nv_t.astype(np.int64)

    totals = counts.sum(axis=2)
    order, width = unit_order(totals, paired)
    bits = (1 << np.arange(D, dtype=np.int64))
    masks = ((counts > 0) * bits).sum(axis=2)                       # int64[B, E]
    passes = -(-counts // cfg.lanes)                                 # ceil(n / lanes)
    n_act = (totals > 0).sum(axis=1)
    units = int(-(-n_act.max() // width)) if B else 0

    ar = np.arange(B)
    ddr_free = np.zeros((B, D))
    comp_free = np.zeros((B, D))
    link_free = np.zeros((B, D, D))
    slot_rel = np.zeros((B, D, S))
    slot_cnt = np.zeros((B, D), np.int64)
    busy = np.zeros((B, D))
    ddr_busy = np.zeros((B, D))
    d2d = np.zeros(B)
    done = np.zeros(B)
    peak_of = np.unique(np.linspace(0, B - 1, min(B, peak_sample)).astype(np.int64)) if B else np.zeros(0, np.int64)
    if snapshot is not None and snapshot not in peak_of:
        peak_of = np.sort(np.r_[peak_of, snapshot])
    P = peak_of.size
    peak = np.zeros((P, D), np.int64)
    in_p = np.full(B, -1)
    in_p[peak_of] = np.arange(P)
    pmask = in_p >= 0
    activity: list = []
    snap = snapshot
    eps = 1e-15

    def acquire(die: np.ndarray, t_ready: np.ndarray, live: np.ndarray):
        """Reserve the next ring-buffer slot of `die`; return (slot index, time it is free)."""
        si = slot_cnt[ar, die] % S
        free_at = slot_rel[ar, die, si]
        return si, free_at

    def occupy(die: np.ndarray, si: np.ndarray, t: np.ndarray, live: np.ndarray):
        slot_cnt[ar, die] += live
        slot_rel[ar, die, si] = np.where(live, np.inf, slot_rel[ar, die, si])   # held until released
        if P:
            sel = pmask & live
            if sel.any():
                b = np.flatnonzero(sel)
                occ = (slot_rel[b, die[b], :] > t[b, None]).sum(axis=1)
                pi = in_p[b]
                peak[pi, die[b]] = np.maximum(peak[pi, die[b]], occ)

    for u in range(units):
        ue = order[:, u * width:(u + 1) * width]                    # int64[B, width]
        umask = np.bitwise_or.reduce(masks[ar[:, None], ue], axis=1)
        # Alg. 1: c* = the first idle chiplet of the unit's trajectory (earliest free compute)
        in_traj = ((umask[:, None] >> np.arange(D)) & 1).astype(bool)
        cstar = np.argmin(np.where(in_traj, comp_free, np.inf), axis=1)
        for j in range(width * M):
            e = ue[:, j % width]
            m = masks[ar, e]
            valid = m > 0
            if not valid.any():
                continue
            in_m = ((m[:, None] >> np.arange(D)) & 1).astype(bool)
            si_all = slot_cnt % S
            slot_ready = slot_rel.reshape(B * D, S)[(ar[:, None] * D + np.arange(D)).ravel(),
                                                     si_all.ravel()].reshape(B, D)
            if rule5:
                # Rule 5: the channel that frees first streams the micro-slice into the trajectory
                # die with the most free slots (the DDR controller "sends" it there)
                ch = np.argmin(ddr_free, axis=1)
                t_ch = ddr_free[ar, ch]
                free_slots = (slot_rel <= t_ch[:, None, None]).sum(axis=2)
                a = np.argmax(np.where(in_m, free_slots - slot_ready * 1e-3, -np.inf), axis=1)
            else:
                ready = np.maximum(ddr_free, slot_ready)
                a = np.argmin(ready + eps * (~in_m), axis=1)
                if j < width:               # Alg. 1 line 7: the unit's first micro-slice to c*
                    a = np.where(valid & in_m[ar, cstar], cstar, a)
                ch = a
            si, free_at = acquire(a, slot_ready[ar, a], valid)
            t0 = np.maximum(ddr_free[ar, ch], free_at)
            occupy(a, si, t0, valid)
            t_arr = t0 + t_load + cfg.ddr_latency_s
            ddr_free[ar, ch] = np.where(valid, t0 + t_load, ddr_free[ar, ch])
            ddr_busy[ar, ch] += np.where(valid, t_load, 0.0)
            if snap is not None and valid[snap]:
                activity.append(("ddr", int(ch[snap]), float(t0[snap]), float(t0[snap] + t_load), int(e[snap])))
            cur, cur_si, here = a.copy(), si, t_arr
            cur_done = t_arr.copy()              # when the current holder has finished computing
            nv = np.where(valid, nv_t[a, m], 0)
            for v in range(int(nv.max())):
                live = v < nv
                d = np.where(live, vis_t[a, m, v], cur)
                move = live & (d != cur)
                if move.any():
                    si2, free2 = acquire(d, here, move)
                    s0 = np.maximum.reduce([here, link_free[ar, cur, d], free2])
                    hops = hop_t[a, m, v]
                    arrive = s0 + t_xfer + hops * lat
                    link_free[ar, cur, d] = np.where(move, s0 + t_xfer, link_free[ar, cur, d])
                    occupy(d, si2, s0, move)
                    rel = np.maximum(cur_done, s0 + t_xfer)
                    slot_rel[ar, cur, cur_si] = np.where(move, rel, slot_rel[ar, cur, cur_si])
                    d2d += np.where(move, ms_bytes * np.maximum(hops, 1), 0.0)
                    if snap is not None and move[snap]:
                        activity.append(("d2d", int(cur[snap]), float(s0[snap]), float(s0[snap] + t_xfer),
                                         int(e[snap])))
                    here = np.where(move, arrive, here)
                    cur_si = np.where(move, si2, cur_si)
                    cur = np.where(move, d, cur)
                # Rule 1/2: compute on the local tokens of expert e
                n_pass = passes[ar, e, d]
                dur = np.where(live, n_pass * t_pass + cfg.ctrl_overhead_s, 0.0)
                c0 = np.maximum(here, comp_free[ar, d])
                c1 = c0 + dur
                comp_free[ar, d] = np.where(live, c1, comp_free[ar, d])
                busy[ar, d] += dur
                cur_done = np.where(live, c1, cur_done)
                done = np.maximum(done, np.where(live, c1, 0.0))
                if snap is not None and live[snap]:
                    activity.append(("compute", int(d[snap]), float(c0[snap]), float(c1[snap]), int(e[snap])))
            # Rule 3: release after the last visit
            slot_rel[ar, cur, cur_si] = np.where(valid, cur_done, slot_rel[ar, cur, cur_si])
    return FlowResult(done, busy, ddr_busy, d2d, peak, peak_of, ms_bytes, activity)
