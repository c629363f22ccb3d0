"""The experts one rank hosts, per a `Placement` (replicas allowed), and the model's MoE blocks.

transformers 5 stores the routed experts of Qwen3-MoE / Mixtral / Qwen2-MoE / OLMoE as one
module `mlp.experts` with 3-D parameters `gate_up_proj` float[N, 2I, H] and `down_proj`
float[N, H, I], next to the router `mlp.gate` (the families whose record declares `runtime`,
`sempar.families`). `LocalExperts` keeps the
slices of the experts a device hosts at one layer (its S slots: `Placement.slots(l)[g]`) and
computes exactly what `Qwen3MoeExperts.forward` / `MixtralExperts.forward` compute for them:
act(x W_gate) * (x W_up) W_down times the routing weight, summed with `index_add_` in increasing
expert id.
"""

from __future__ import annotations

from typing import Any

import torch

from sempar.errors import InputError
from sempar.families import of_model, supporting


class LocalExperts:
    """gate_up: float32[S, 2I, H]; down: float32[S, H, I]; logical: int64[S] expert ids;
    slot_of: int64[N] slot of each logical expert on this device (-1: not hosted)."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, logical: torch.Tensor,
                 num_experts: int, act: Any):
        order = torch.argsort(logical)
        self.gate_up, self.down = gate_up[order].contiguous(), down[order].contiguous()
        self.logical = logical[order]
        self.slot_of = torch.full((num_experts,), -1, dtype=torch.int64, device=logical.device)
        self.slot_of[self.logical] = torch.arange(self.logical.numel(), device=logical.device)
        self.act = act

    @classmethod
    def from_block(cls, block: Any, hosted: list[int] | Any) -> "LocalExperts":
        """Copy the hosted experts' weights out of a model's sparse MoE block."""
        experts = getattr(block, "experts", None)
        if experts is None or not hasattr(experts, "gate_up_proj"):
            raise InputError(f"{type(block).__name__}: no `experts` module with 3-D "
                             "gate_up_proj / down_proj (unsupported MoE class)")
        ids = torch.as_tensor(list(hosted), dtype=torch.int64)
        with torch.no_grad():
            return cls(experts.gate_up_proj.detach()[ids].clone(),
                       experts.down_proj.detach()[ids].clone(), ids,
                       int(experts.gate_up_proj.shape[0]), experts.act_fn)

    def apply(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor,
              mask: torch.Tensor) -> torch.Tensor:
        """x: float32[n, H]; ids: int64[n, k]; w: float32[n, k]; mask: bool[n, k] the
        activations to compute here (all must be hosted). Returns float32[n, H]:
        sum over masked j of w[t, j] * expert_{ids[t, j]}(x[t])."""
        out = torch.zeros_like(x)
        if x.shape[0] == 0 or not bool(mask.any()):
            return out
        slot = torch.where(mask, self.slot_of[ids], -1)
        if bool((mask & (slot < 0)).any()):
            raise RuntimeError("an activation was sent to a device that does not host its expert")
        for s in torch.unique(slot[slot >= 0]).tolist():
            tok, pos = torch.where(slot == s)
            gate, up = torch.nn.functional.linear(x[tok], self.gate_up[s]).chunk(2, dim=-1)
            h = torch.nn.functional.linear(self.act(gate) * up, self.down[s])
            out.index_add_(0, tok, h * w[tok, pos, None])
        return out


def moe_blocks(model: Any) -> list[Any]:
    """The sparse MoE block (`mlp` with its router and `experts`) of every decoder layer.

    The model's family must declare `runtime` support (`sempar.families`); an unregistered
    model type is taken when its blocks have the structure (`mlp.gate`, `mlp.experts`)."""
    fam = of_model(model)
    mt = getattr(model.config, "model_type", None)
    if fam is not None and not fam.runtime:
        raise InputError(f"model type {mt!r}: the runtime serves "
                         f"{', '.join(supporting('runtime'))} (routed experts only, SwiGLU "
                         "without biases)")
    router = fam.router_attr if fam is not None else "gate"
    blocks = []
    for i, layer in enumerate(model.model.layers):
        mlp = getattr(layer, "mlp", None)
        if mlp is None or not hasattr(mlp, router) or not hasattr(mlp, "experts"):
            raise InputError(f"layer {i}: {type(mlp).__name__} is not a sparse MoE block "
                             "(dense layers are not supported by the runtime yet)")
        if getattr(mlp, "shared_expert", None) is not None:
            raise InputError(f"layer {i}: shared experts are not supported by the runtime yet")
        blocks.append(mlp)
    return blocks


def load_local_experts(model: Any, placement: Any, rank: int) -> list[LocalExperts]:
    """Per MoE layer, this rank's experts (its slots in `placement`), then drop the full
    expert tensors from the model (only the local copies stay in memory)."""
    blocks = moe_blocks(model)
    if placement.num_layers != len(blocks):
        raise InputError(f"placement has {placement.num_layers} layers, the model "
                         f"{len(blocks)} MoE layers")
    n = int(blocks[0].experts.gate_up_proj.shape[0])
    if placement.num_experts != n:
        raise InputError(f"placement has {placement.num_experts} experts, the model {n}")
    out = []
    for l, b in enumerate(blocks):
        out.append(LocalExperts.from_block(b, placement.slots(l)[rank].tolist()))
        b.experts = None
    return out
