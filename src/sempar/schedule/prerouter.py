"""Exact pre-routing in Attention-TP through the gate's linearity (ours, issue 16).

Sem-MoE Alg. 3 and s-MoE Alg. 2 choose a token's device before its router runs, from a
prediction. In Attention-TP they need not guess. Rank g holds a partial sum p_g of the attention
output (its heads' share of o_proj, the bias on rank 0) and the replicated residual h; the router
sees RMSNorm(r) = s * (w ⊙ r) with r = h + Σ_g p_g and a per-token scalar s = rsqrt(mean(r²) + eps)
> 0, and the gate is linear, so

    W · RMSNorm(r) = s * (Σ_g W(w ⊙ p_g) + W(w ⊙ h)).

Every rank computes its partial logits float32[T, N] (rank 0 adds the residual's), one all-reduce
of [T, N] gives z = W(w ⊙ r) on every rank (bitwise the same there), and for routers whose choice
is a monotone function of s * z the top-k of z is the router's own choice:

| model_type | selection on z | exact? |
| --- | --- | --- |
| mixtral, qwen2_moe, qwen3_moe, olmoe | top-k of softmax(s z) = top-k of z | yes |
| deepseek_v2 (greedy, group_limited_greedy) | groups by max softmax, then top-k | yes |
| deepseek_v3 | sigmoid(s z) + bias, groups by sum of top-2, top-k | no: s moves the bias' weight |
| gpt_oss | top-k of s z + b | no |

Where it is not exact we choose (ours) s from the replicated residual alone,
s ≈ rsqrt(mean(h²) + eps), the only scale every rank knows without another collective; the
agreement rate with the router is measured (tests), not assumed.

The home of a token is then chosen knowing its real experts with the capacity-bound oracle rule
of `schedule.homes.oracle_home` (`placement.capacity`): per batch every device takes an equal
share (tp mode's reduce-scatter chunks), tokens propose to their best device first and a full
device spills each token to *its* next-best device (proposal rounds), never to the next device
in id order. The router then runs as usual on the home device, so the layer's output is unchanged.

Costs an all-reduce of T x N logits per layer (`Comm` collective `prerouting`; the simulator's
pipeline `smoe-exact`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sempar.errors import InputError
from sempar.placement import capacity

SOFTMAX_TOPK = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
EXACT_FAMILIES = SOFTMAX_TOPK + ("deepseek_v2",)
APPROX_FAMILIES = ("deepseek_v3", "gpt_oss")


def _mlp_router(layer: Any) -> Any:
    mlp = layer.mlp
    return getattr(mlp, "gate", None) if hasattr(mlp, "gate") else getattr(mlp, "router", None)


@dataclass
class PreRouter:
    """The pre-router of one MoE layer.

    weight: float32[N, H] the gate's W times the post-attention RMSNorm's w (column-wise), so
    that partial logits are one matmul; bias: float32[N] or None (gpt_oss' router bias,
    deepseek_v3's e_score_correction_bias); model_type: the selection rule (table above);
    top_k, n_group, topk_group, topk_method: the router's settings; eps: the RMSNorm's epsilon
    (used only by the approximate families' residual scale).
    """

    weight: torch.Tensor
    model_type: str
    top_k: int
    bias: torch.Tensor | None = None
    n_group: int = 1
    topk_group: int = 1
    topk_method: str = "greedy"
    eps: float = 1e-6
    norm_weight: torch.Tensor | None = None

    @classmethod
    def from_layer(cls, layer: Any, model_type: str) -> "PreRouter":
        """From an HF decoder layer (its `post_attention_layernorm` and its MoE router)."""
        if model_type not in EXACT_FAMILIES + APPROX_FAMILIES:
            raise InputError(f"pre-routing: model_type {model_type!r} is not one of "
                             f"{', '.join(EXACT_FAMILIES + APPROX_FAMILIES)}")
        gate, norm = _mlp_router(layer), layer.post_attention_layernorm
        if gate is None:
            raise InputError("pre-routing: the layer has no MoE router (a dense layer)")
        w = norm.weight.detach().float()
        W = gate.weight.detach().float() * w[None, :]
        bias = getattr(gate, "e_score_correction_bias", None)
        if model_type == "gpt_oss":
            bias = gate.bias
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
        return cls(weight=W, model_type=model_type, top_k=int(gate.top_k),
                   bias=None if bias is None else bias.detach().float(),
                   n_group=int(getattr(gate, "num_group", getattr(gate, "n_group", 1)) or 1),
                   topk_group=int(getattr(gate, "topk_group", 1) or 1),
                   topk_method=str(getattr(gate, "topk_method", "greedy")), eps=float(eps),
                   norm_weight=w)

    @property
    def exact(self) -> bool:
        """True when the pre-routed top-k is the router's own choice (up to float ties)."""
        return self.model_type in EXACT_FAMILIES

    @property
    def num_experts(self) -> int:
        return int(self.weight.shape[0])

    def partial_logits(self, part: torch.Tensor) -> torch.Tensor:
        """part: float[T, H] a rank's partial sum (or the residual) -> float32[T, N] W(w ⊙ part)."""
        return part.float() @ self.weight.to(part.device).T

    def residual_scale(self, residual: torch.Tensor) -> torch.Tensor:
        """float32[T, 1]: rsqrt(mean(h²) + eps), the approximate families' stand-in for s."""
        h = residual.float()
        return torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)

    def select(self, logits: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """logits: float32[T, N] the all-reduced z = W(w ⊙ r); scale: float32[T, 1], the
        approximate families' s (None: 1). Returns int64[T, k], the pre-routed experts."""
        z = logits.float()
        k = self.top_k
        if self.model_type in SOFTMAX_TOPK or (self.model_type == "deepseek_v2"
                                               and self.topk_method == "greedy"):
            return torch.topk(z, k, dim=-1).indices
        if self.model_type == "deepseek_v2":                      # group_limited_greedy
            return _grouped_topk(z, z.view(z.shape[0], self.n_group, -1).max(-1).values,
                                 self.topk_group, k, self.n_group)
        sz = z * (scale.to(z.device) if scale is not None else 1.0)
        if self.model_type == "gpt_oss":
            return torch.topk(sz + self._bias(z), k, dim=-1).indices
        choice = torch.sigmoid(sz) + self._bias(z)                # deepseek_v3
        groups = choice.view(z.shape[0], self.n_group, -1).topk(2, dim=-1).values.sum(-1)
        return _grouped_topk(choice, groups, self.topk_group, k, self.n_group)

    def _bias(self, z: torch.Tensor) -> torch.Tensor:
        return self.bias.to(z.device) if self.bias is not None else torch.zeros_like(z[0])


def _grouped_topk(score: torch.Tensor, group_score: torch.Tensor, topk_group: int, k: int,
                  n_group: int) -> torch.Tensor:
    """Top-k of `score` float[T, N] inside the `topk_group` best of `n_group` groups."""
    T, N = score.shape
    keep = torch.zeros_like(group_score, dtype=torch.bool)
    keep.scatter_(1, torch.topk(group_score, topk_group, dim=-1).indices, True)
    mask = keep[:, :, None].expand(T, n_group, N // n_group).reshape(T, N)
    return torch.topk(score.masked_fill(~mask, float("-inf")), k, dim=-1).indices


def prerouters(model: Any) -> list[PreRouter]:
    """One PreRouter per decoder layer of an HF causal LM (MoE layers only are allowed)."""
    mt = model.config.model_type
    return [PreRouter.from_layer(ly, mt) for ly in model.model.layers]


def device_hits(ids: torch.Tensor, hosts: torch.Tensor) -> torch.Tensor:
    """int64[T, G]: how many of each token's experts ids int[T, k] device g hosts (bool[G, N])."""
    return hosts.T.long()[ids.long()].sum(dim=1)


def capacity_home(hits: torch.Tensor, batch: int | None = None) -> torch.Tensor:
    """int64[T]: home device per token, equal shares of every batch (the capacity-bound oracle).

    hits: int[T, G] local activations per device; per batch of `batch` tokens (None: the whole
    input) `placement.capacity.capacity_home`, the rule of `schedule.homes.oracle_home`, run on
    the host (one round trip); the result is on hits' device.
    """
    if batch is not None and batch < 1:
        raise InputError(f"batch: {batch} is not a positive integer")
    home = capacity.capacity_home(hits.cpu().numpy(), batch)
    return torch.from_numpy(home).to(hits.device)


def exact_homes(experts: torch.Tensor, hosts: torch.Tensor, batch: int | None = None
                ) -> torch.Tensor:
    """int64[T, L]: capacity-aligned homes of pre-routed experts int[T, L, k] under hosts
    bool[L, G, N] (per layer, per batch)."""
    T, L, _ = experts.shape
    return torch.stack([capacity_home(device_hits(experts[:, l], hosts[l]), batch)
                        for l in range(L)], dim=1) if L else experts.new_zeros((T, 0))
