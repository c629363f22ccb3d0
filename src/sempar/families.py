"""One record per Hugging Face MoE model family (`config.model_type`): where its router and MoE
blocks are, its top-k rule as one function, and what each part of sempar supports for it.

Read by the recorder (`trace.routers`: the router class, shared experts), CAMoE's cost-aware gate
hook (`routing.hook`: the router's logits and top-k rule), exact pre-routing
(`schedule.prerouter`, `schedule.agreement`: the same top-k rule on all-reduced logits), the
runtime (`runtime.experts.moe_blocks`) and the exporters (`export.engines`: which engines cannot
load a placement for it). Adding a family is one `Family` record here plus its tests
(tests/models/test_families.py runs every record through the recorder, the hook and the pre-router on a
tiny random-weight model of the family). Like vLLM's `MixtureOfExperts` interface
(`model_executor/models/interfaces.py`): model knowledge in one place, declared, not re-derived.

The top-k rules, copied from transformers 5.x's router modules (each returns
`(router_logits, weights[tokens, k], indices[tokens, k])`):

| model_type                 | router logits Z            | top-k rule on Z                                 |
| -------------------------- | -------------------------- | ----------------------------------------------- |
| mixtral                    | linear(h, W)               | top-k of softmax(Z) (float via .float()), renormalised |
| qwen2_moe, qwen3_moe, olmoe| linear(h, W)               | top-k of softmax(Z, float), renormalised if norm_topk_prob, cast back |
| deepseek_v2                | linear(h.float, W.float)   | softmax; greedy top-k, or group_limited_greedy (groups by max), x routed_scaling_factor |
| deepseek_v3                | linear(h.float, W.float)   | sigmoid(Z) + e_score_correction_bias, best topk_group of n_group groups (sum of top-2), top-k; weights = sigmoid at the indices, renormalised, x routed_scaling_factor |
| gpt_oss                    | linear(h, W, b)            | top-k of Z, softmax over the k                   |

`Family.topk(router, z, z_weights=None)` -> `(weights, indices)`: experts chosen on `z`, weights
from `z_weights` at those experts when given (the hook's `select` mode), else from `z`. `router`
is the router module itself or a `RouterParams` (the pre-router's copy of its settings).

Pre-routing (`prerouting`): "exact" where the choice is a monotone function of s * z for any
per-token RMSNorm scale s > 0 (then the top-k of z is the router's own), "approx" where it is not
(a bias moves with s), None where unsupported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from sempar.errors import InputError


# --------------------------------------------------------------------------- shared experts

def _no_shared(config: Any) -> int:
    return 0


def _qwen2_moe_shared(config: Any) -> int:
    return 1 if (getattr(config, "shared_expert_intermediate_size", 0) or 0) > 0 else 0


def n_shared_experts(config: Any) -> int:
    """The generic rule (`config.n_shared_experts`, 0 when absent): DeepSeek's, and the one an
    unregistered model type gets."""
    return int(getattr(config, "n_shared_experts", 0) or 0)


# --------------------------------------------------------------------------- router logits

def _linear(router: Any, hidden: Any) -> Any:
    import torch.nn.functional as F

    return F.linear(hidden.reshape(-1, router.hidden_dim), router.weight)


def _linear_bias(router: Any, hidden: Any) -> Any:
    import torch.nn.functional as F

    return F.linear(hidden, router.weight, router.bias)


def _linear_fp32(router: Any, hidden: Any) -> Any:
    import torch
    import torch.nn.functional as F

    hidden = hidden.view(-1, router.hidden_dim)
    return F.linear(hidden.type(torch.float32), router.weight.type(torch.float32))


# --------------------------------------------------------------------------- top-k rules

def _softmax_topk(always_norm: bool, fp32_via_cast: bool, cast_back: bool) -> Callable:
    """Mixtral / Qwen-MoE / OLMoE: top-k of the softmax, renormalised (always, or if
    `norm_topk_prob`), weights cast back to the logits' dtype (Qwen, OLMoE)."""

    def topk(router: Any, z: Any, z_weights: Any = None):
        import torch

        def probs_of(x):
            if fp32_via_cast:
                return torch.nn.functional.softmax(x.float(), dim=-1)
            return torch.nn.functional.softmax(x, dtype=torch.float, dim=-1)

        top_value, indices = torch.topk(probs_of(z), router.top_k, dim=-1)
        if z_weights is not None:
            top_value = probs_of(z_weights).gather(1, indices)
        if always_norm or router.norm_topk_prob:
            top_value /= top_value.sum(dim=-1, keepdim=True)
        if cast_back:
            top_value = top_value.to(z.dtype)
        return top_value, indices

    return topk


def _topk_then_softmax(router: Any, z: Any, z_weights: Any = None):
    """GPT-OSS: top-k of the (bias-included) logits, softmax over the k chosen."""
    import torch

    top_value, indices = torch.topk(z, router.top_k, dim=-1)
    if z_weights is not None:
        top_value = z_weights.gather(-1, indices)
    return torch.nn.functional.softmax(top_value, dim=1, dtype=top_value.dtype), indices


def _group_mask(group_scores: Any, topk_group: int, num_experts: int) -> Any:
    """bool[T, N]: the experts of each row's `topk_group` best groups (group_scores [T, n_group])."""
    import torch

    n_group = group_scores.shape[-1]
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    return (group_mask.unsqueeze(-1).expand(-1, n_group, num_experts // n_group)
            .reshape(-1, num_experts).bool())


def _sigmoid_grouped(router: Any, z: Any, z_weights: Any = None):
    """DeepSeek-V3: sigmoid + correction bias, group-limited (group score = sum of its top-2)."""
    import torch

    scores = z.sigmoid()
    choice = scores + router.e_score_correction_bias
    n, N = router.num_group, router.num_experts
    group_scores = choice.view(-1, n, N // n).topk(2, dim=-1)[0].sum(dim=-1)
    choice = choice.masked_fill(~_group_mask(group_scores, router.topk_group, N), float("-inf"))
    indices = torch.topk(choice, k=router.top_k, dim=-1, sorted=False)[1]
    weights = (z_weights.sigmoid() if z_weights is not None else scores).gather(1, indices)
    if router.norm_topk_prob:
        weights /= weights.sum(dim=-1, keepdim=True) + 1e-20
    return weights * router.routed_scaling_factor, indices


def _softmax_grouped(router: Any, z: Any, z_weights: Any = None):
    """DeepSeek-V2: softmax; `greedy` top-k, or `group_limited_greedy` (group score = its max)."""
    import torch

    scores = z.softmax(dim=-1, dtype=torch.float32)
    if router.topk_method == "greedy":
        top_value, indices = torch.topk(scores, k=router.top_k, dim=-1, sorted=False)
    elif router.topk_method == "group_limited_greedy":
        n, N = router.num_group, router.num_experts
        group_scores = scores.view(-1, n, N // n).max(dim=-1).values
        scores = scores.masked_fill(~_group_mask(group_scores, router.topk_group, N), 0.0)
        top_value, indices = torch.topk(scores, k=router.top_k, dim=-1, sorted=False)
    else:
        raise InputError(f"deepseek_v2 router: topk_method {router.topk_method!r} is not greedy "
                         "or group_limited_greedy")
    if z_weights is not None:
        top_value = z_weights.softmax(dim=-1, dtype=torch.float32).gather(1, indices)
    return top_value * router.routed_scaling_factor, indices


# --------------------------------------------------------------------------- the record

PREROUTING = ("exact", "approx")


@dataclass(frozen=True)
class Family:
    """One HF MoE model family. The router is `layer.mlp.<router_attr>` of class `router_class`
    (a layer without one is dense); its logits are `logits(router, hidden)` and its choice is
    `topk(router, z, z_weights=None) -> (weights float[T, k], indices int64[T, k])`.

    Capabilities: `cost_routing` (routing.hook can bias it), `prerouting` ("exact", "approx" or
    None), `runtime` (sempar bench's runtime serves its MoE blocks: routed experts only, 3-D
    gate_up_proj / down_proj, SwiGLU without biases), `no_placement_in` (engines whose
    placement file cannot be loaded for it; export.engines)."""

    model_type: str
    router_class: str
    logits: Callable[[Any, Any], Any]
    topk: Callable[..., tuple[Any, Any]]
    shared_experts: Callable[[Any], int] = n_shared_experts
    router_attr: str = "gate"
    linear_bias: bool = False          # the router's linear has a bias (added after the scale)
    cost_routing: bool = True
    prerouting: str | None = "exact"
    runtime: bool = False
    no_placement_in: frozenset[str] = field(default_factory=frozenset)

    def router_of(self, layer: Any) -> Any:
        """The router module of an HF decoder layer, None for a dense layer."""
        r = getattr(getattr(layer, "mlp", None), self.router_attr, None)
        return r if type(r).__name__ == self.router_class else None


# no_placement_in: SGLang 0.5.23 has no `get_model_config_for_expert_location` for Mixtral and
# OLMoE; vLLM 0.33.0's EPLB needs the model to implement `MixtureOfExperts`, which OLMoE,
# Qwen2-MoE and GPT-OSS do not (export/engines.py). runtime: routed experts only, SwiGLU without
# biases (Qwen2-MoE has a shared expert, DeepSeek dense layers and shared experts, GPT-OSS
# expert biases and a clamped activation).
MIXTRAL = Family("mixtral", "MixtralTopKRouter", _linear,
                 _softmax_topk(always_norm=True, fp32_via_cast=True, cast_back=False),
                 _no_shared, runtime=True, no_placement_in=frozenset({"sglang"}))
_QWEN_TOPK = _softmax_topk(always_norm=False, fp32_via_cast=False, cast_back=True)
QWEN2_MOE = Family("qwen2_moe", "Qwen2MoeTopKRouter", _linear, _QWEN_TOPK, _qwen2_moe_shared,
                   no_placement_in=frozenset({"vllm"}))
QWEN3_MOE = Family("qwen3_moe", "Qwen3MoeTopKRouter", _linear, _QWEN_TOPK, _no_shared,
                   runtime=True)
OLMOE = Family("olmoe", "OlmoeTopKRouter", _linear, _QWEN_TOPK, _no_shared, runtime=True,
               no_placement_in=frozenset({"sglang", "vllm"}))
DEEPSEEK_V2 = Family("deepseek_v2", "DeepseekV2TopkRouter", _linear_fp32, _softmax_grouped)
DEEPSEEK_V3 = Family("deepseek_v3", "DeepseekV3TopkRouter", _linear_fp32, _sigmoid_grouped,
                     prerouting="approx")
GPT_OSS = Family("gpt_oss", "GptOssTopKRouter", _linear_bias, _topk_then_softmax, _no_shared,
                 router_attr="router", linear_bias=True, prerouting="approx",
                 no_placement_in=frozenset({"vllm"}))

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    MIXTRAL, QWEN2_MOE, QWEN3_MOE, OLMOE, DEEPSEEK_V2, DEEPSEEK_V3, GPT_OSS)}


def family(model_type: Any, what: str = "") -> Family:
    """The record of `model_type`; InputError naming the registered ones otherwise."""
    f = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if f is None:
        raise InputError(f"model type {model_type!r}: {what + ' ' if what else ''}supports "
                         f"{', '.join(sorted(FAMILIES))}")
    return f


def of_model(model: Any) -> Family | None:
    """The record of an HF model (`model.config.model_type`), None when unregistered."""
    return FAMILIES.get(getattr(getattr(model, "config", None), "model_type", None))


def supporting(capability: str) -> list[str]:
    """Sorted model types whose record declares `capability` ("cost_routing", "prerouting",
    "runtime") true / not None."""
    return sorted(t for t, f in FAMILIES.items() if getattr(f, capability))


def refused_by(engine: str) -> frozenset[str]:
    """Model types whose placement `engine` cannot load (`Family.no_placement_in`)."""
    return frozenset(t for t, f in FAMILIES.items() if engine in f.no_placement_in)


@dataclass(frozen=True)
class RouterParams:
    """A router module's settings, copied (the pre-router keeps them without the module):
    the attributes the `topk` rules read, named as transformers names them."""

    top_k: int
    num_experts: int
    norm_topk_prob: bool = False
    e_score_correction_bias: Any = None      # float32[N] (deepseek_v3)
    num_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    topk_method: str = "greedy"

    @classmethod
    def of(cls, router: Any) -> "RouterParams":
        bias = getattr(router, "e_score_correction_bias", None)
        return cls(top_k=int(router.top_k), num_experts=int(router.num_experts),
                   norm_topk_prob=bool(getattr(router, "norm_topk_prob", False)),
                   e_score_correction_bias=None if bias is None else bias.detach().float(),
                   num_group=int(getattr(router, "num_group", getattr(router, "n_group", 1)) or 1),
                   topk_group=int(getattr(router, "topk_group", 1) or 1),
                   routed_scaling_factor=float(getattr(router, "routed_scaling_factor", 1.0)),
                   topk_method=str(getattr(router, "topk_method", "greedy")))

    def to(self, device: Any) -> "RouterParams":
        from dataclasses import replace

        b = self.e_score_correction_bias
        return self if b is None or b.device == device else \
            replace(self, e_score_correction_bias=b.to(device))
