"""Expert parallelism on the chiplet package: the EP and Hydra baselines (FSE-DP §II-B, §VI-A).

EP as the paper runs it (`ep`, `buffers=1`): every die hosts a distinct subset of the experts
(contiguous blocks, expert e on die e * D // E); tokens are sharded over the dies and replicated to
the dies of their experts (all-to-all dispatch, one copy per (token, remote die)), computed there
and sent back (combine). A die keeps one whole expert on chip at a time, the "one-chip-one-slice"
mapping of §I: it loads the expert from its own DDR channel, computes every token routed to it, frees
the buffer and only then loads its next active expert (ours, the paper gives no EP pipeline; §IV
says any load/compute overlap needs a second buffer, "nearly doubling the on-chip memory", and
Fig. 12's EP at about 5x FSE-DP's < 32 MB matches one int8 Phi-3.5 expert per die).
`ep-db` (`buffers=2`, ours, stronger than the paper's baseline): whole-expert double buffering, the
next expert loads while the current one computes (a third must wait for the buffer of the one two
back). All dies wait for the dispatch before computing; the layer ends with the combine.

Hydra (`hydra`, `hydra-db`) uses the same engine with a per-layer placement and token homes from
hydra.py.

On-chip memory of one instance (`peak_bytes`, summed over the D dies; W = expert_params x
weight_bytes, a = d_model x act_bytes, n tokens, K experts per token):

- weights: min(active experts of die d, buffers) x W per die (a die with no active expert holds none);
- tokens: n home activations (one per token, on its home die) + one replicated copy per (token,
  remote die hosting one of its experts) + one output per (token, expert) pair held until the
  combine: (n + copies + n K) x a. Nothing else is replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sempar.chiplet.hardware import ChipletConfig
from sempar.chiplet.workload import Instances


@dataclass
class EPResult:
    """latency float64[B]; busy float64[B, D] compute time; peak_bytes float64[B] (on-chip weights +
    activations summed over dies); d2d_bytes float64[B]; activity of the snapshot instance."""

    latency: np.ndarray
    busy: np.ndarray
    peak_bytes: np.ndarray
    d2d_bytes: np.ndarray
    activity: list = field(default_factory=list)


def contiguous_placement(E: int, D: int, layers: int) -> np.ndarray:
    """die_of int64[layers, E]: expert e on die e * D // E in every layer."""
    return np.broadcast_to(np.arange(E) * D // E, (layers, E)).copy()


def simulate_ep(inst: Instances, die_of: np.ndarray, home: np.ndarray, cfg: ChipletConfig,
                d_model: int, expert_params: int, weight_bytes: float,
                snapshot: int | None = None, buffers: int = 1) -> EPResult:
    """Simulate EP-style execution of every instance.

    die_of: int64[L, E] placement per model layer; home: int64[sum n_b] home die per token row;
    buffers: whole-expert buffers per die, 1 (the paper's EP: load, compute, free) or 2 (double
    buffering: the next expert loads while the current one computes).
    """
    if buffers not in (1, 2):
        raise ValueError(f"buffers must be 1 or 2, not {buffers}")
    B, D, E = inst.B, cfg.dies, inst.num_experts
    sizes = inst.sizes()
    b_of = np.repeat(np.arange(B), sizes)
    lay = inst.layer[b_of]
    ex = inst.experts.astype(np.int64)
    tdie = die_of[lay[:, None], ex]                              # int64[N, K]
    has = np.zeros((ex.shape[0], D), bool)
    has[np.arange(ex.shape[0])[:, None], tdie] = True
    tok_bytes = d_model * cfg.act_bytes
    # dispatch bytes[b, s, d]: one copy per (token, remote die)
    rows, dies = np.nonzero(has)
    idx = (b_of[rows] * D + home[rows]) * D + dies
    bytes_sd = np.bincount(idx, minlength=B * D * D).reshape(B, D, D).astype(np.float64) * tok_bytes
    bytes_sd[:, np.arange(D), np.arange(D)] = 0.0
    lat = cfg.fdi_latency_s + cfg.hop_latency_s
    t_disp = cfg.mesh.link_time(bytes_sd, cfg.d2d_bw, lat)
    t_comb = cfg.mesh.link_time(bytes_sd.transpose(0, 2, 1).copy(), cfg.d2d_bw, lat)

    totals = np.zeros(B * E, np.int64)
    np.add.at(totals, (b_of[:, None] * E + ex).ravel(), 1)
    totals = totals.reshape(B, E)
    # hosted[l, d, i]: i-th expert of die d in layer l (-1 padding), id order
    L = die_of.shape[0]
    cap = int(max(np.bincount(die_of[l], minlength=D).max() for l in range(L)))
    hosted = np.full((L, D, cap), -1, np.int64)
    for l in range(L):
        for d in range(D):
            h = np.flatnonzero(die_of[l] == d)
            hosted[l, d, :h.size] = h
    w_bytes = expert_params * weight_bytes
    t_load = w_bytes / cfg.ddr_bw_per_die + cfg.xfer_overhead_s
    t_pass = 2.0 * cfg.lanes * expert_params / cfg.peak_ops
    ar = np.arange(B)[:, None]
    load_free = np.zeros((B, D))
    comp_free = np.broadcast_to(t_disp[:, None], (B, D)).copy()
    c_prev = np.zeros((B, D))        # compute end of the previous active expert
    c_prev2 = np.zeros((B, D))       # ... and of the one before (its buffer frees the next load)
    busy = np.zeros((B, D))
    n_active = np.zeros((B, D), np.int64)
    activity: list = []
    hl = hosted[inst.layer]                                           # int64[B, D, cap]
    for i in range(cap):
        e = hl[:, :, i]
        n = np.where(e >= 0, totals[ar, np.maximum(e, 0)], 0)
        act = n > 0
        ls = np.maximum(load_free, c_prev if buffers == 1 else c_prev2)   # the buffer is free
        le = ls + t_load + cfg.ddr_latency_s
        cs = np.maximum(le, comp_free)
        dur = -(-n // cfg.lanes) * t_pass + cfg.ctrl_overhead_s
        ce = cs + dur
        load_free = np.where(act, ls + t_load, load_free)
        comp_free = np.where(act, ce, comp_free)
        c_prev2 = np.where(act, c_prev, c_prev2)
        c_prev = np.where(act, ce, c_prev)
        busy += np.where(act, dur, 0.0)
        n_active += act
        if snapshot is not None:
            for d in np.flatnonzero(act[snapshot]):
                activity.append(("ddr", int(d), float(ls[snapshot, d]), float(ls[snapshot, d] + t_load),
                                 int(e[snapshot, d])))
                activity.append(("compute", int(d), float(cs[snapshot, d]), float(ce[snapshot, d]),
                                 int(e[snapshot, d])))
    end = np.where(n_active > 0, comp_free, t_disp[:, None]).max(axis=1)
    latency = end + t_comb
    if snapshot is not None:
        for s in range(D):
            if bytes_sd[snapshot, s].sum() > 0:
                activity.append(("d2d", s, 0.0, float(t_disp[snapshot]), -1))
                activity.append(("d2d", s, float(end[snapshot]), float(latency[snapshot]), -1))
    # on-chip memory (module doc): `buffers` whole experts per die, home tokens, replicated copies,
    # one output per (token, expert) pair before the combine
    w_peak = (np.minimum(n_active, buffers) * w_bytes).sum(axis=1)
    remote = dies != home[rows]
    copies = np.bincount(b_of[rows[remote]], minlength=B)
    pairs = sizes * ex.shape[1]
    tok_peak = (sizes + copies + pairs) * tok_bytes
    return EPResult(latency, busy, w_peak + tok_peak, bytes_sd.sum(axis=(1, 2)), activity)
