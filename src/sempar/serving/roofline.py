"""Compute time of one serving iteration from a roofline (the execution-time predictor).

Every operator costs max(FLOPs / (peak x flops_eff), bytes / (bandwidth x bw_eff)) on one device
(the roofline); an iteration runs every layer once over the batch of that iteration. Per layer:

- attention projections: 2 x attn_params FLOPs per token, the weights read once;
- attention core: `attn_flops_ctx` FLOPs per (query, cached token) pair; bytes: the KV cache each
  request reads (decode: its whole context; a prefill chunk: its context so far plus the chunk);
- dense layers' MLP, shared experts, router (h x N): like the projections;
- routed experts (`expert_seconds`): per device, 6 x h x I FLOPs per (token, expert) copy it
  serves and 3 x h x I weights read per distinct expert it activates; the layer waits for the
  slowest device;
- the LM head: 2 x h x V FLOPs per token that samples (decodes, and prefills that finish), its
  weights read once per iteration.

Attention-DP: every rank runs its own requests with the full attention weights, and every MoE
layer waits for the slowest rank. Attention-TP: the G devices split heads and weights (FLOPs,
weights and KV reads / G) of one batch. Activations are not counted (small against weights and
KV at these sizes); kernels are assumed to overlap nothing and launch for free (choices ours).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import numpy as np

from sempar.serving.dims import ModelDims
from sempar.serving.hardware import Accelerator


def roof(flops, nbytes, acc: Accelerator):
    """Seconds: max of compute and memory time (numpy broadcasting)."""
    return np.maximum(np.asarray(flops, np.float64) / acc.eff_flops,
                      np.asarray(nbytes, np.float64) / acc.eff_bw)


@dataclass
class Roofline:
    """dims, acc: the model and the device; G: EP degree; tp: attention TP over the G devices."""

    dims: ModelDims
    acc: Accelerator
    G: int
    _: KW_ONLY
    tp: bool

    def __post_init__(self) -> None:
        d, w = self.dims, self.dims.dtype_bytes
        s = self.G if self.tp else 1
        P, hN, hV = d.attn_params, d.hidden * d.num_experts, d.hidden * d.vocab
        F, B = self.acc.eff_flops, self.acc.eff_bw
        # (seconds per FLOP-driving unit, seconds per byte-driving unit) of: projections,
        # attention core, router, shared experts, dense MLP, LM head
        self._c = [(2 * P / s / F, P * w / s / B), (d.attn_flops_ctx / s / F, d.kv_elems * w / s / B),
                   (2 * hN / F, hN * w / B), (2 * d.shared_params / s / F, d.shared_params * w / s / B),
                   (2 * d.dense_mlp_params / s / F, d.dense_mlp_params * w / s / B),
                   (2 * hV / s / F, hV * w / s / B)]

    def dense_seconds(self, prefill, decode, attn_ctx, kv_read, sampled) -> np.ndarray:
        """Seconds of everything but the routed experts and communication, float64[K], for K
        iterations given as float64[K, I] arrays per attention instance (DP: I = G ranks; TP:
        I = 1 group): prefill / decode tokens, attn_ctx = sum over query tokens of their context
        length, kv_read = cached tokens read, sampled = tokens that produce an output token."""
        n = prefill + decode
        live = n > 0
        (pf, pb), (af, ab), (rf, rb), (sf, sb), (mf, mb), (hf, hb) = self._c
        attn = np.maximum(pf * n, pb * live) + np.maximum(af * attn_ctx, ab * kv_read)
        moe = attn + np.maximum(rf * n, rb * live)
        if sf:
            moe += np.maximum(sf * n, sb * live)
        d = self.dims
        # MoE layers wait for the slowest instance before their all-to-all (Attention-DP).
        out = d.moe_layers * moe.max(axis=-1) + np.maximum(hf * sampled, hb * (sampled > 0)).max(axis=-1)
        if d.dense_layers:
            out += d.dense_layers * (attn + np.maximum(mf * n, mb * live)).max(axis=-1)
        return out

    def expert_seconds(self, copies: np.ndarray, active: np.ndarray) -> np.ndarray:
        """Seconds of the routed experts: copies, active float[..., L, G] (token-expert copies
        served, distinct experts activated per device and layer) -> float[...] summed over
        layers of the slowest device."""
        d = self.dims
        t = roof(2 * d.expert_params * copies, d.expert_params * d.dtype_bytes * active, self.acc)
        return t.max(axis=-1).sum(axis=-1)

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
