"""Design-space sweeps (FSE-DP §VI-D, §VI-E; Figs. 16, 17, 18).

- `buffer_x_ddr`: utilization of FSE-DP (paired-load) over on-chip buffer size x DDR bandwidth per
  die at fixed D2D bandwidth, with eqs. 1-2 feasibility (Fig. 16(a));
- `ddr_x_d2d`: the same over DDR x D2D bandwidth at a 14 MB buffer (Fig. 16(b));
- `microslice_x_buffer`: MoE-layer latency over micro-slice count x buffer size (Fig. 17);
- `scaling`: utilization of EP, Hydra and FSE-DP (paired-load) on 2x2 .. 4x4 meshes (Fig. 18).

Every point reruns the simulator on the given (usually shortened) workload; points where the
buffer cannot hold two micro-slices are NaN.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from sempar.chiplet.hardware import MB, ChipletConfig, area_mm2, feasible, power_w
from sempar.chiplet.simulate import simulate
from sempar.chiplet.strategies import STRATEGIES
from sempar.chiplet.workload import Workload
from sempar.errors import InputError

BUFFERS_MB = (4, 8, 12, 16, 24, 32)
DDR_GBPS = (12.8, 25.6, 38.4, 51.2, 64.0)
D2D_GBPS = (144, 288, 432, 576)
MICRO_SLICES = (2, 4, 8, 16, 32)
MESHES = ((2, 2), (3, 3), (4, 4))


def _point(wl: Workload, cfg: ChipletConfig, strategy: str, precision: str, micro_slices: int):
    try:
        return simulate(wl, cfg, [STRATEGIES.get(strategy)], precision, micro_slices)[strategy]
    except InputError:
        return None


def buffer_x_ddr(wl, cfg, precision="int8", micro_slices=None, buffers=BUFFERS_MB, ddr=DDR_GBPS,
                 strategy="fsedp+paired-load", tick: Callable[[], None] | None = None) -> dict:
    util = np.full((len(buffers), len(ddr)), np.nan)
    ok = np.zeros_like(util, bool)
    for i, b in enumerate(buffers):
        for j, g in enumerate(ddr):
            c = cfg.with_(buffer_bytes=int(b * MB), ddr_bw_per_die=g * 1e9)
            r = _point(wl, c, strategy, precision, micro_slices)
            util[i, j] = np.nan if r is None else r.utilization
            ok[i, j] = feasible(c)
            if tick:
                tick()
    return {"buffer_mb": list(buffers), "ddr_gbps_per_die": list(ddr), "d2d_gbps": cfg.d2d_bw / 1e9,
            "utilization": util.tolist(), "feasible": ok.tolist(), "strategy": strategy}


def ddr_x_d2d(wl, cfg, precision="int8", micro_slices=None, ddr=DDR_GBPS, d2d=D2D_GBPS, buffer_mb=14,
              strategy="fsedp+paired-load", tick: Callable[[], None] | None = None) -> dict:
    util = np.full((len(ddr), len(d2d)), np.nan)
    ok = np.zeros_like(util, bool)
    for i, g in enumerate(ddr):
        for j, x in enumerate(d2d):
            c = cfg.with_(buffer_bytes=int(buffer_mb * MB), ddr_bw_per_die=g * 1e9, d2d_bw=x * 1e9)
            r = _point(wl, c, strategy, precision, micro_slices)
            util[i, j] = np.nan if r is None else r.utilization
            ok[i, j] = feasible(c)
            if tick:
                tick()
    return {"ddr_gbps_per_die": list(ddr), "d2d_gbps": list(d2d), "buffer_mb": buffer_mb,
            "utilization": util.tolist(), "feasible": ok.tolist(), "strategy": strategy,
            "area_mm2_at_star": area_mm2(cfg), "power_w_at_star": power_w(cfg)}


def microslice_x_buffer(wl, cfg, precision="int8", micro=MICRO_SLICES, buffers=BUFFERS_MB,
                        strategy="fsedp+paired-load", tick: Callable[[], None] | None = None) -> dict:
    lat = np.full((len(micro), len(buffers)), np.nan)
    for i, m in enumerate(micro):
        for j, b in enumerate(buffers):
            r = _point(wl, cfg.with_(buffer_bytes=int(b * MB)), strategy, precision, m)
            lat[i, j] = np.nan if r is None else r.layer_latency_s
            if tick:
                tick()
    return {"micro_slices": list(micro), "buffer_mb": list(buffers), "layer_latency_s": lat.tolist(),
            "strategy": strategy}


def scaling(wl, cfg, precision="int8", micro_slices=None, meshes=MESHES,
            strategies=("ep", "hydra", "fsedp+paired-load"), tick: Callable[[], None] | None = None) -> dict:
    out = {s: [] for s in strategies}
    for r_, c_ in meshes:
        c = cfg.with_(rows=r_, cols=c_)
        for s in strategies:
            r = _point(wl, c, s, precision, micro_slices)
            out[s].append(np.nan if r is None else r.utilization)
            if tick:
                tick()
    return {"meshes": [f"{r}x{c}" for r, c in meshes], "utilization": out}


def points(kind: str) -> int:
    return {"buffer_x_ddr": len(BUFFERS_MB) * len(DDR_GBPS), "ddr_x_d2d": len(DDR_GBPS) * len(D2D_GBPS),
            "microslice_x_buffer": len(MICRO_SLICES) * len(BUFFERS_MB), "scaling": len(MESHES) * 3}[kind]
