"""Naive fully sharded expert data-parallelism (FSE-DP §III, Fig. 3; ablation A1).

The package computes one expert at a time (active experts in id order). Before each expert the tokens
that activate it are redistributed so every die holds about n_e / D of them (a point-to-point
exchange of the surplus tokens; they return after the expert, ours). The expert is split into D
slices, die d loads slice d from its DDR channel, and the slices circulate on the ring in D phases:
in each phase every die computes its token sequence with the slice it holds while it sends that
slice to the next die (phases are synchronised: a phase lasts the slowest die's compute or the slice
transfer). The next expert's slice loads during the current expert (one slice of look-ahead), so a
die holds two slices: §IV's "nearly doubling the on-chip memory requirement for expert weights".

On-chip memory of one instance (`peak_bytes`, summed over the D dies; W = expert_params x
weight_bytes, a = d_model x act_bytes, n tokens):

- weights: two slices of W / D per die while a next expert exists (one when the instance has a
  single active expert): min(active experts, 2) x W over the package, nothing replicated;
- tokens: one copy of the n inputs and one of the n outputs (2 n a), plus the redistributed tokens
  of the expert with the largest surplus, held on their borrowing die with their outputs until they
  return (2 x max_e surplus_e x a). Weights and other tokens are never replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sempar.chiplet.hardware import ChipletConfig


@dataclass
class NaiveResult:
    latency: np.ndarray        # float64[B]
    busy: np.ndarray           # float64[B, D]
    peak_bytes: np.ndarray     # float64[B]
    d2d_bytes: np.ndarray      # float64[B]
    activity: list = field(default_factory=list)


def simulate_naive(counts: np.ndarray, n_tokens: np.ndarray, cfg: ChipletConfig, d_model: int,
                   expert_params: int, weight_bytes: float, snapshot: int | None = None) -> NaiveResult:
    """counts int[B, E, D] (tokens of expert e homed on die d); n_tokens int[B] tokens per instance."""
    B, E, D = counts.shape
    slice_bytes = expert_params * weight_bytes / D
    t_load = slice_bytes / cfg.ddr_bw_per_die + cfg.xfer_overhead_s + cfg.ddr_latency_s
    lat = cfg.fdi_latency_s + cfg.hop_latency_s
    ring_hops = cfg.mesh.hops[cfg.mesh.ring, np.roll(cfg.mesh.ring, -1)].max()
    t_xfer = slice_bytes / cfg.d2d_bw + cfg.xfer_overhead_s + ring_hops * lat
    t_pass = 2.0 * cfg.lanes * (expert_params / D) / cfg.peak_ops
    tok_bytes = d_model * cfg.act_bytes
    totals = counts.sum(axis=2)
    load_end = np.zeros(B)          # all dies load in lockstep (equal slices, one channel each)
    t = np.zeros(B)                 # end of the previous expert
    prev_start = np.zeros(B)
    busy = np.zeros((B, D))
    d2d = np.zeros(B)
    nact = np.zeros(B, np.int64)
    lent = np.zeros(B, np.int64)    # most tokens on loan to another die during one expert
    act_list = []
    for e in range(E):
        n = totals[:, e]
        act = n > 0
        if not act.any():
            continue
        share = (n[:, None] + np.arange(D)[None, ::-1]) // D                       # balanced split
        moved = np.maximum(counts[:, e, :] - share, 0).sum(axis=1)
        lent = np.maximum(lent, moved)
        surplus = moved * tok_bytes
        t_redis = np.where(surplus > 0, surplus / cfg.d2d_bw + lat, 0.0)
        ls = np.maximum(load_end, prev_start)          # the buffer of the slice two back is free
        le = ls + t_load
        comp = np.where(share > 0, -(-share // cfg.lanes) * t_pass + cfg.ctrl_overhead_s, 0.0)
        phase = np.maximum(comp.max(axis=1), t_xfer)
        start = np.maximum(le, t)
        end = start + t_redis + (D - 1) * phase + comp.max(axis=1) + t_redis
        load_end = np.where(act, ls + t_load - cfg.ddr_latency_s, load_end)
        prev_start = np.where(act, start, prev_start)
        t = np.where(act, end, t)
        busy += np.where(act[:, None], D * comp, 0.0)
        d2d += np.where(act, 2 * surplus + (D - 1) * D * slice_bytes, 0.0)
        nact += act
        if snapshot is not None and act[snapshot]:
            s = snapshot
            for d in range(D):
                act_list.append(("ddr", d, float(ls[s]), float(le[s]), e))
                for p in range(D):
                    c0 = start[s] + t_redis[s] + p * phase[s]
                    act_list.append(("compute", d, float(c0), float(c0 + comp[s, d]), e))
                    if p < D - 1:
                        act_list.append(("d2d", d, float(c0), float(c0 + t_xfer), e))
    w_peak = np.minimum(nact, 2) * D * slice_bytes
    tok_peak = 2 * (n_tokens + lent) * tok_bytes   # inputs + outputs, and the borrowed ones (doc)
    return NaiveResult(t, busy, w_peak + tok_peak, d2d, act_list)
