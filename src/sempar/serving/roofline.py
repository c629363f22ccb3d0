"""Compute time of one serving iteration (the execution-time predictor's compute part).

Each operator block (roof_parts.py: attention, router + shared experts, routed experts, dense
MLP, LM head) costs its plain roofline, max(FLOPs / (peak x flops_eff), bytes / (bandwidth x
bw_eff)), corrected by the accelerator's measured profile where one exists: t = F_op +
roofline x s(tokens), F_op the fixed cost of the block and s the measured efficiency,
interpolated (calibration.py, accel_profile.py); without a profile s = 1 and F_op is the
fixed per-kernel cost fitted on the shipped H100 profile (GPUs; none for `cpu`). An iteration
runs every layer once over the batch of that iteration. Per layer:

- attention projections and core over the KV cache (decode: its whole context; a prefill
  chunk: its context so far plus the chunk);
- dense layers' MLP, shared experts, router (h x N);
- routed experts (`expert_seconds`): per device, from the token-expert copies it serves and
  the distinct experts it activates; the MoE block's fixed cost is paid by every device with
  copies; the layer waits for the slowest device;
- the LM head over the tokens that sample (decodes, and prefills that finish).

Attention-DP: every rank runs its own requests with the full attention weights, and every MoE
layer waits for the slowest rank. Attention-TP: the G devices split heads and weights (FLOPs,
weights and KV reads / G) of one batch. `Accelerator.compute_scale` multiplies every compute
time (the report's sensitivity line). Kernels are assumed to overlap nothing (choice ours).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import numpy as np

from sempar.serving.calibration import Calibration
from sempar.serving.dims import ModelDims
from sempar.serving.hardware import Accelerator
from sempar.serving.roof_parts import RoofParts, roof  # noqa: F401  (roof: re-exported)


@dataclass
class Roofline:
    """dims, acc: the model and the device; G: EP degree; tp: attention TP over the G devices."""

    dims: ModelDims
    acc: Accelerator
    G: int
    _: KW_ONLY
    tp: bool

    def __post_init__(self) -> None:
        self.parts = RoofParts(self.dims, self.acc, self.G if self.tp else 1)
        self.cal = Calibration(self.dims, self.acc, self.G)
        self._k = float(self.acc.compute_scale)

    # ---- blocks (the units a profile measures; `sempar calibrate check` prices them here) ---
    def attention_seconds(self, prefill, decode, attn_ctx, kv_read) -> np.ndarray:
        """One attention layer of each instance: prefill / decode tokens, attn_ctx = sum over
        query tokens of their context, kv_read = cached tokens read (float64 arrays)."""
        n = np.asarray(prefill, np.float64) + decode
        s = self.cal.attention_s(prefill, decode, np.asarray(attn_ctx) / np.maximum(n, 1e-12))
        t = self.parts.attention(n, attn_ctx, kv_read) * s + self.cal.fixed["attention"] * (n > 0)
        return t * self._k

    def router_shared_seconds(self, n) -> np.ndarray:
        """Router and shared experts over the n tokens an instance routes (the MoE block's
        efficiency at its n x top_k copies; its fixed cost is in `expert_device_seconds`)."""
        n = np.asarray(n, np.float64)
        return self.parts.router_shared(n) * self.cal.s("moe_block", n * self.dims.top_k) * self._k

    def expert_device_seconds(self, copies, active) -> np.ndarray:
        """Routed experts of each device (float arrays of copies and active experts)."""
        c = np.asarray(copies, np.float64)
        t = self.parts.experts(c, active) * self.cal.s("moe_block", c)
        return (t + self.cal.fixed["moe_block"] * (c > 0)) * self._k

    def dense_mlp_seconds(self, n) -> np.ndarray:
        n = np.asarray(n, np.float64)
        t = self.parts.dense_mlp(n) * self.cal.s("dense_mlp", n)
        return (t + self.cal.fixed["dense_mlp"] * (n > 0)) * self._k

    def head_seconds(self, sampled) -> np.ndarray:
        s = np.asarray(sampled, np.float64)
        t = self.parts.head(s) * self.cal.s("lm_head", s)
        return (t + self.cal.fixed["lm_head"] * (s > 0)) * self._k

    # ---- one iteration ------------------------------------------------------------------------
    def dense_seconds(self, prefill, decode, attn_ctx, kv_read, sampled) -> np.ndarray:
        """Seconds of everything but the routed experts and communication, float64[K], for K
        iterations given as float64[K, I] arrays per attention instance (DP: I = G ranks; TP:
        I = 1 group): prefill / decode tokens, attn_ctx = sum over query tokens of their context
        length, kv_read = cached tokens read, sampled = tokens that produce an output token."""
        n = prefill + decode
        attn = self.attention_seconds(prefill, decode, attn_ctx, kv_read)
        moe = attn + self.router_shared_seconds(n)
        d = self.dims
        # MoE layers wait for the slowest instance before their all-to-all (Attention-DP).
        out = d.moe_layers * moe.max(axis=-1) + self.head_seconds(sampled).max(axis=-1)
        if d.dense_layers:
            out += d.dense_layers * (attn + self.dense_mlp_seconds(n)).max(axis=-1)
        return out

    def expert_seconds(self, copies: np.ndarray, active: np.ndarray) -> np.ndarray:
        """Seconds of the routed experts: copies, active float[..., L, G] (token-expert copies
        served, distinct experts activated per device and layer) -> float[...] summed over
        layers of the slowest device."""
        return self.expert_device_seconds(copies, active).max(axis=-1).sum(axis=-1)

    # ---- memory ---------------------------------------------------------------------------
    def weight_bytes(self, slots_per_device: int) -> float:
        """Bytes of weights one device holds (DP: attention and dense parts whole; TP: / G)."""
        d = self.dims
        s = self.G if self.tp else 1
        rest = (d.layers * d.attn_params + d.dense_layers * d.dense_mlp_params
                + d.moe_layers * (d.shared_params + d.hidden * d.num_experts)) / s
        head = 2 * d.hidden * d.vocab / s          # embedding + LM head (untied)
        return (rest + head + d.moe_layers * slots_per_device * d.expert_params) * d.dtype_bytes

    def kv_capacity(self, slots_per_device: int) -> int:
        """Tokens of KV cache one attention instance holds (DP: per rank; TP: the group)."""
        free = self.acc.memory * self.acc.mem_util - self.weight_bytes(slots_per_device)
        per_tok = self.dims.kv_bytes_per_token() / (self.G if self.tp else 1)
        return max(0, int(free // per_tok))
