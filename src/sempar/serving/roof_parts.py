"""The plain roofline of each operator block the serving forecast prices (no measurements).

Every block costs max(FLOPs / (peak x flops_eff), bytes / (bandwidth x bw_eff)) on one device.
The blocks are the units an accelerator profile measures (accel_profile.py) and the calibration
corrects (calibration.py), so the same functions price a forecast's iteration and a profile's
measured point:

- `attention`: the attention projections (2 x attn_params FLOPs per token, weights read once)
  plus the core over the KV cache (`attn_flops_ctx` FLOPs per (query, cached token) pair; bytes:
  the cached tokens read);
- `router_shared`: the router GEMM (h x N) and the shared experts, over the tokens a rank routes;
- `experts`: the routed experts of one device: 6 x h x I FLOPs per token-expert copy it serves,
  3 x h x I weights read per distinct expert it activates;
- `dense_mlp`: a dense layer's MLP; `head`: the LM head (2 x h x V FLOPs per sampled token).

Attention-TP splits heads and weights over the G devices (FLOPs, weights and KV reads / G).
Activations are not counted (small against weights and KV at these sizes).
"""

from __future__ import annotations

import numpy as np

from sempar.serving.dims import ModelDims
from sempar.serving.hardware import Accelerator


def roof(flops, nbytes, acc: Accelerator):
    """Seconds: max of compute and memory time (numpy broadcasting)."""
    return np.maximum(np.asarray(flops, np.float64) / acc.eff_flops,
                      np.asarray(nbytes, np.float64) / acc.eff_bw)


class RoofParts:
    """Roofline seconds of each block for model `dims` on `acc`; `split` = G under Attention-TP
    (heads and weights divided), 1 otherwise. Arguments are float64 arrays of any shape."""

    def __init__(self, dims: ModelDims, acc: Accelerator, split: int = 1):
        d, w, s = dims, dims.dtype_bytes, split
        P, hN, hV = d.attn_params, d.hidden * d.num_experts, d.hidden * d.vocab
        F, B = acc.eff_flops, acc.eff_bw
        self.dims = dims
        # (seconds per FLOP-driving unit, seconds per byte-driving unit) of each part
        self.proj = (2 * P / s / F, P * w / s / B)
        self.core = (d.attn_flops_ctx / s / F, d.kv_elems * w / s / B)
        self.router = (2 * hN / F, hN * w / B)
        self.shared = (2 * d.shared_params / s / F, d.shared_params * w / s / B)
        self.mlp = (2 * d.dense_mlp_params / s / F, d.dense_mlp_params * w / s / B)
        self.lm = (2 * hV / s / F, hV * w / s / B)
        self.expert = (2 * d.expert_params / F, d.expert_params * w / B)

    @staticmethod
    def _gemm(c: tuple, n, live):
        return np.maximum(c[0] * n, c[1] * live)

    def attention(self, n, attn_ctx, kv_read):
        """n tokens (prefill + decode) of one instance, attn_ctx = sum over them of their
        context, kv_read = cached tokens read."""
        n = np.asarray(n, np.float64)
        return self._gemm(self.proj, n, n > 0) + np.maximum(self.core[0] * np.asarray(attn_ctx),
                                                            self.core[1] * np.asarray(kv_read))

    def router_shared(self, n):
        n = np.asarray(n, np.float64)
        out = self._gemm(self.router, n, n > 0)
        if self.shared[0]:
            out = out + self._gemm(self.shared, n, n > 0)
        return out

    def experts(self, copies, active):
        return np.maximum(self.expert[0] * np.asarray(copies, np.float64),
                          self.expert[1] * np.asarray(active, np.float64))

    def dense_mlp(self, n):
        n = np.asarray(n, np.float64)
        return self._gemm(self.mlp, n, n > 0)

    def head(self, sampled):
        s = np.asarray(sampled, np.float64)
        return self._gemm(self.lm, s, s > 0)

    # ---- one measured point of a profile (the shapes `sempar calibrate` measures) ---------
    def moe_block_point(self, copies: float, experts_per_rank: int) -> float:
        """One MoE block on one EP rank: `copies` token-expert copies spread evenly over its
        `experts_per_rank` experts, routed from copies / top_k tokens."""
        n = max(1, int(copies) // self.dims.top_k)
        return float(self.router_shared(n) + self.experts(copies, min(experts_per_rank, copies)))

    def attention_point(self, phase: str, tokens: float, context: float) -> float:
        """decode: `tokens` requests of `context` cached tokens each; prefill: one chunk of
        `tokens` attending to `context` cached tokens (non-causal, as measured)."""
        if phase == "decode":
            return float(self.attention(tokens, tokens * context, tokens * context))
        return float(self.attention(tokens, tokens * context, context))
