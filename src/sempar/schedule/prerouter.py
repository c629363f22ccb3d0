"""Exact pre-routing in Attention-TP through the gate's linearity (ours, issue 16).

Sem-MoE Alg. 3 and s-MoE Alg. 2 choose a token's device before its router runs, from a
prediction. In Attention-TP they need not guess. Rank g holds a partial sum p_g of the attention
output (its heads' share of o_proj, the bias on rank 0) and the replicated residual h; the router
sees RMSNorm(r) = s * (w ⊙ r) with r = h + Σ_g p_g and a per-token scalar s = rsqrt(mean(r²) + eps)
> 0, and the gate is linear, so

    W · RMSNorm(r) = s * (Σ_g W(w ⊙ p_g) + W(w ⊙ h)).

Every rank computes its partial logits float32[T, N] (rank 0 adds the residual's), one all-reduce
of [T, N] gives z = W(w ⊙ r) on every rank (bitwise the same there), and for routers whose choice
is a monotone function of s * z the top-k of z is the router's own choice. The selection is the
family's own top-k rule (`sempar.families`, `Family.topk`, the rule the cost-aware hook uses), and
the record declares whether it is exact (`Family.prerouting`):

| family | selection on z | exact? |
| --- | --- | --- |
| Mixtral, Qwen2/3-MoE, OLMoE | top-k of softmax(s z) = top-k of softmax(z) | yes |
| DeepSeek-V2 (greedy, group_limited_greedy) | groups by max softmax, then top-k | yes |
| DeepSeek-V3 | sigmoid(s z) + bias, groups by sum of top-2, top-k | no: s moves the bias' weight |
| GPT-OSS | top-k of s z + b | no |

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
from sempar.families import Family, RouterParams, family, supporting
from sempar.placement import capacity

@dataclass
class PreRouter:
    """The pre-router of one MoE layer.

    weight: float32[N, H] the gate's W times the post-attention RMSNorm's w (column-wise), so
    that partial logits are one matmul; family: the model family (`sempar.families`, its top-k
    rule and whether pre-routing is exact); params: the router's settings (top-k, groups,
    deepseek_v3's e_score_correction_bias); bias: float32[N] or None, gpt_oss' router linear
    bias (added after the scale); eps: the RMSNorm's epsilon (used only by the approximate
    families' residual scale).
    """

    weight: torch.Tensor
    family: Family
    params: RouterParams
    bias: torch.Tensor | None = None
    eps: float = 1e-6
    norm_weight: torch.Tensor | None = None

    @classmethod
    def from_layer(cls, layer: Any, model_type: str) -> "PreRouter":
        """From an HF decoder layer (its `post_attention_layernorm` and its MoE router)."""
        fam = family(model_type, "pre-routing")
        if fam.prerouting is None:
            raise InputError(f"pre-routing: model_type {model_type!r} is not one of "
                             f"{', '.join(supporting('prerouting'))}")
        gate, norm = fam.router_of(layer), layer.post_attention_layernorm
        if gate is None:
            raise InputError("pre-routing: the layer has no MoE router (a dense layer)")
        w = norm.weight.detach().float()
        W = gate.weight.detach().float() * w[None, :]
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
        return cls(weight=W, family=fam, params=RouterParams.of(gate),
                   bias=gate.bias.detach().float() if fam.linear_bias else None,
                   eps=float(eps), norm_weight=w)

    @property
    def exact(self) -> bool:
        """True when the pre-routed top-k is the router's own choice (up to float ties)."""
        return self.family.prerouting == "exact"

    @property
    def top_k(self) -> int:
        return self.params.top_k

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
        approximate families' s (None: 1). Returns int64[T, k], the pre-routed experts: the
        family's own top-k rule (`Family.topk`) on z (exact families: any s > 0 gives the same
        choice), or on s z + b (approximate ones)."""
        z = logits.float()
        if not self.exact:
            z = z * (scale.to(z.device) if scale is not None else 1.0)
            if self.bias is not None:
                z = z + self.bias.to(z.device)
        return self.family.topk(self.params.to(z.device), z)[1]


def prerouters(model: Any) -> list[PreRouter]:
    """One PreRouter per decoder layer of an HF causal LM (MoE layers only are allowed)."""
    mt = model.config.model_type
    return [PreRouter.from_layer(ly, mt) for ly in model.model.layers]


def device_hits(ids: torch.Tensor, hosts: torch.Tensor) -> torch.Tensor:
    """int64[T, G]: how many of each token's experts ids int[T, k] device g hosts (bool[G, N])."""
    return hosts.T.long()[ids.long()].sum(dim=1)


def capacity_home(hits: torch.Tensor, batch: int | None = None,
                  rule: str = capacity.DEFAULT_ASSIGN) -> torch.Tensor:
    """int64[T]: home device per token, equal shares of every batch (the capacity-bound oracle).

    hits: int[T, G] local activations per device; per batch of `batch` tokens (None: the whole
    input) `placement.capacity.capacity_home`, the rule of `schedule.homes.oracle_home`, run on
    the host (one round trip); the result is on hits' device. rule: `capacity.ASSIGN_RULES`,
    the "optimal" assignment (default: the most local activations within the shares; 1-2x the
    greedy rounds' host time, docs/placement.md "The exact home rule") or "proposal" rounds.
    """
    if batch is not None and batch < 1:
        raise InputError(f"batch: {batch} is not a positive integer")
    home = capacity.capacity_home(hits.cpu().numpy(), batch, rule=rule)
    return torch.from_numpy(home).to(hits.device)


def exact_homes(experts: torch.Tensor, hosts: torch.Tensor, batch: int | None = None,
                rule: str = capacity.DEFAULT_ASSIGN) -> torch.Tensor:
    """int64[T, L]: capacity-aligned homes of pre-routed experts int[T, L, k] under hosts
    bool[L, G, N] (per layer, per batch; `rule` as in `capacity_home`)."""
    T, L, _ = experts.shape
    return torch.stack([capacity_home(device_hits(experts[:, l], hosts[l]), batch, rule)
                        for l in range(L)], dim=1) if L else experts.new_zeros((T, 0))
