"""Attention between MoE layers, as head parallelism across the dies (FSE-DP §VI-C; a simple model).

Each die takes heads / D of the heads: it loads its share of the Q, K, V, O weights (4 x D_model^2,
ours) and of the KV cache of every request in the batch from its DDR channel and computes its share
of the projections (2 x n x attn_params ops) and of the score/value products (4 x ctx x D_model ops
per token). An all-gather of the n output activations over D2D ends the block. The time is the
larger of compute and DDR time plus the all-gather (no overlap with the MoE layer, ours). The same
for every strategy except where token buffering changes a layer's batch.
"""

from __future__ import annotations

import numpy as np

from sempar.chiplet.hardware import ChipletConfig
from sempar.chiplet.models import MoEModel
from sempar.chiplet.workload import Instances


def attention_seconds(inst: Instances, model: MoEModel, cfg: ChipletConfig, weight_bytes: float) -> np.ndarray:
    """float64[B]: attention time before each MoE-layer instance."""
    B, D = inst.B, cfg.dies
    sizes = inst.sizes()
    b_of = np.repeat(np.arange(B), sizes)
    ctx = inst.ctx.astype(np.float64)
    ops = 2.0 * sizes * model.attn_params + 4.0 * np.bincount(b_of, weights=ctx, minlength=B) * model.d_model
    # KV bytes: every request's longest context in the batch, K and V of d_model each
    key = b_of.astype(np.int64) * (int(inst.request.max()) + 1) + inst.request
    uk, inv = np.unique(key, return_inverse=True)
    mx = np.zeros(uk.size)
    np.maximum.at(mx, inv, ctx)
    kv = np.bincount(uk // (int(inst.request.max()) + 1), weights=mx, minlength=B) * 2 * model.d_model * cfg.act_bytes
    ddr = (model.attn_params * weight_bytes + kv) / (D * cfg.ddr_bw_per_die)
    comp = ops / (D * cfg.peak_ops)
    gather = (D - 1) / D * sizes * model.d_model * cfg.act_bytes / cfg.d2d_bw
    lat = cfg.mesh.hops.max() * (cfg.fdi_latency_s + cfg.hop_latency_s)
    return np.maximum(ddr, comp) + gather + lat
