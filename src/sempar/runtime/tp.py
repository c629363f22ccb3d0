"""Attention tensor parallelism (Megatron-LM's head split): which head counts split over G ranks,
and one rank's copy of an HF attention module holding its heads."""

from __future__ import annotations

import copy
from typing import Any

import torch

from sempar.errors import InputError


def heads_split(num_heads: int, num_kv: int, world: int) -> str | None:
    """None when `num_heads` query heads (grouped over `num_kv` KV heads) split evenly over
    `world` ranks with every rank's query heads sharing its KV heads evenly; else why not."""
    if num_heads % world:
        return f"{num_heads} attention heads do not split over {world} ranks"
    per = num_heads // world
    kv = len({h // (num_heads // num_kv) for h in range(per)})
    if per % kv:
        return f"{per} query heads per rank do not share {kv} KV heads evenly"
    return None


def tp_attention(attn: Any, rank: int, world: int, num_heads: int, num_kv: int) -> Any:
    """A copy of the attention module holding rank's heads (Megatron TP): q/k/v rows and o_proj
    columns of its heads; KV heads are replicated when world > num_kv. Its output is a partial
    sum over heads (to be all-reduced / reduce-scattered)."""
    why = heads_split(num_heads, num_kv, world)
    if why:
        raise InputError(f"tensor parallelism: {why}")
    hd = attn.head_dim
    per = num_heads // world
    groups = num_heads // num_kv
    q_heads = list(range(rank * per, (rank + 1) * per))
    kv_heads = sorted({h // groups for h in q_heads})
    if per % len(kv_heads):
        raise InputError(f"tensor parallelism: {per} query heads per rank do not share "
                         f"{len(kv_heads)} KV heads evenly")
    a = copy.deepcopy(attn)

    def rows(heads: list[int]) -> torch.Tensor:
        return torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in heads])

    q, kv = rows(q_heads), rows(kv_heads)
    with torch.no_grad():
        for name, r in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            lin = getattr(a, name)
            lin.weight = torch.nn.Parameter(lin.weight[r].clone())
            if lin.bias is not None:
                lin.bias = torch.nn.Parameter(lin.bias[r].clone())
        a.o_proj.weight = torch.nn.Parameter(a.o_proj.weight[:, q].clone())
        if a.o_proj.bias is not None and rank != 0:
            a.o_proj.bias = torch.nn.Parameter(torch.zeros_like(a.o_proj.bias))
    a.num_key_value_groups = per // len(kv_heads)
    return a
