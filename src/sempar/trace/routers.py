"""Router modules of HF MoE models and the hooks that capture their exact choices.

The recorder hangs a forward hook on every MoE router module and keeps what the router itself
returned, so the trace holds the EXACT experts the model used, not a recomputation. In
transformers 5.x every supported family has a router module returning
`(router_logits, weights, indices)` for the flattened hidden states `[batch * seq, hidden]`:

| model_type    | router class            | selection                                      | 2nd output: weights[tokens, k]            |
| ------------- | ----------------------- | ---------------------------------------------- | ----------------------------------------- |
| mixtral       | MixtralTopKRouter       | top-k of softmax(logits), sorted               | top-k probs renormalised to sum 1         |
| qwen2_moe     | Qwen2MoeTopKRouter      | top-k of softmax(logits), sorted               | top-k probs (renormalised if norm_topk_prob) |
| qwen3_moe     | Qwen3MoeTopKRouter      | top-k of softmax(logits), sorted               | same as qwen2_moe                         |
| olmoe         | OlmoeTopKRouter         | top-k of softmax(logits), sorted               | same as qwen2_moe                         |
| deepseek_v3   | DeepseekV3TopkRouter    | sigmoid + e_score_correction_bias, best        | sigmoid scores WITHOUT the bias, gathered |
|               |                         | topk_group of n_group groups (group score =    | at the indices, renormalised if           |
|               |                         | sum of its top-2), then top-k, `sorted=False`  | norm_topk_prob, x routed_scaling_factor   |
| deepseek_v2   | DeepseekV2TopkRouter    | softmax, greedy or group-limited top-k,        | softmax probs at the indices,             |
|               |                         | `sorted=False`                                 | x routed_scaling_factor                   |
| gpt_oss       | GptOssTopKRouter        | top-k of logits (+ router bias), sorted        | softmax over the k selected logits        |

The families and their rules are declared once, in `sempar.families`. All seven return top-k
weights aligned with the indices (none returns a dense [tokens, N] matrix; a router that did
would be gathered at the indices). DeepSeek-V2/V3 select with
`sorted=False`, and V3's choice order (bias-corrected scores) differs from its weight order, so
every row is re-sorted here by decreasing weight, ties broken by expert id: slot 0 is always
the highest weight, as the trace convention requires.

Routers are found by class name (the family record of `model_type`, `sempar.families`;
otherwise any module whose class name ends in "TopKRouter"/"TopkRouter").
Each is mapped to its decoder layer from its module name (`...layers.<i>...`); dense layers
(DeepSeek-V3's `first_k_dense_replace`, Qwen2-MoE's `decoder_sparse_step`/`mlp_only_layers`)
have no router and are not in the trace: `TraceMeta.layer_ids` lists the model layers the L
trace columns stand for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from sempar.errors import InputError
from sempar.families import FAMILIES, n_shared_experts
from sempar.trace.schema import TraceMeta

# --------------------------------------------------------------------------- finding routers

_GENERIC_SUFFIXES = ("TopKRouter", "TopkRouter")
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class RouterSite:
    """One MoE router: its module path, the module, the model layer it belongs to."""

    name: str
    module: Any
    layer_id: int


def find_routers(model: Any) -> list[RouterSite]:
    """The model's MoE routers in layer order (one per MoE layer).

    Raises `InputError` if none is found, or if two routers claim the same layer.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    spec = FAMILIES.get(model_type)

    def is_router(module: Any) -> bool:
        cls = type(module).__name__
        if spec is not None:
            return cls == spec.router_class
        return cls.endswith(_GENERIC_SUFFIXES)

    found = [(name, m) for name, m in model.named_modules() if is_router(m)]
    if not found:
        wanted = spec.router_class if spec else "a class ending in " + "/".join(_GENERIC_SUFFIXES)
        raise InputError(f"model type {model_type!r}: no MoE router module found ({wanted}); "
                         "add its record to sempar.families")
    sites = []
    for order, (name, m) in enumerate(found):
        match = _LAYER_RE.search(name)
        sites.append(RouterSite(name, m, int(match.group(1)) if match else order))
    sites.sort(key=lambda s: s.layer_id)
    ids = [s.layer_id for s in sites]
    if len(set(ids)) != len(ids):
        raise InputError(f"model type {model_type!r}: several routers in one layer "
                         f"({[s.name for s in sites]})")
    return sites


def trace_meta_for(model: Any, sites: Sequence[RouterSite], model_name: str,
                   extra: dict[str, Any] | None = None) -> TraceMeta:
    """`TraceMeta` of a model: L = number of MoE layers, N, k from the routers."""
    config = model.config
    first = sites[0].module
    num_experts = int(first.num_experts)
    top_k = int(first.top_k)
    for s in sites[1:]:
        if int(s.module.num_experts) != num_experts or int(s.module.top_k) != top_k:
            raise InputError(f"{s.name}: {s.module.num_experts} experts top-{s.module.top_k} "
                             f"differs from layer {sites[0].layer_id} ({num_experts}, top-{top_k})")
    spec = FAMILIES.get(config.model_type)
    shared = (spec.shared_experts if spec else n_shared_experts)(config)
    groups = int(getattr(first, "num_group", 1) or 1)
    topk_groups = int(getattr(first, "topk_group", groups) or groups)
    return TraceMeta(model=model_name, num_layers=len(sites), num_experts=num_experts,
                     top_k=top_k, vocab_size=int(config.vocab_size), shared_experts=int(shared),
                     num_expert_groups=groups, topk_groups=topk_groups,
                     layer_ids=tuple(s.layer_id for s in sites),
                     num_hidden_layers=_hidden_layers(config, sites), model_type=config.model_type,
                     extra=dict(extra or {}))


def _hidden_layers(config: Any, sites: Sequence[RouterSite]) -> int | None:
    """`config.num_hidden_layers` when the routers' layer numbers fit in it, else None."""
    n = getattr(config, "num_hidden_layers", None)
    return int(n) if isinstance(n, int) and all(s.layer_id < n for s in sites) else None


# --------------------------------------------------------------------------- capture

def sort_by_weight(indices: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reorder each row's k selections by decreasing weight, ties by increasing expert id.

    indices: int[T, k], weights: float32[T, k] -> the same, reordered per row.
    """
    order = np.lexsort((indices, -weights), axis=-1)
    return (np.take_along_axis(indices, order, axis=-1),
            np.take_along_axis(weights, order, axis=-1))


class RoutingCapture:
    """Forward hooks on the routers; per forward, each layer's (indices, weights) rows.

    Use as a context manager: hooks are removed on exit, also when the forward raises::

        with RoutingCapture(sites) as cap:
            cap.expect(rows)           # batch * seq
            model(...)
            ids, w = cap.take()        # int64[rows, L, k], float32[rows, L, k]
    """

    def __init__(self, sites: Sequence[RouterSite], top_k: int, num_experts: int):
        self.sites = list(sites)
        self.top_k = top_k
        self.num_experts = num_experts
        self._handles: list[Any] = []
        self._expected: int | None = None
        self._got: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(self.sites)

    def __enter__(self) -> "RoutingCapture":
        try:
            for i, site in enumerate(self.sites):
                self._handles.append(site.module.register_forward_hook(self._hook(i)))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, i: int) -> Callable:
        site = self.sites[i]

        def hook(module: Any, args: Any, output: Any) -> None:
            if not isinstance(output, tuple) or len(output) < 3:
                raise RuntimeError(f"{site.name}: router returned {type(output).__name__}, "
                                   "expected (router_logits, weights, indices)")
            weights, indices = output[1], output[2]
            k = self.top_k
            idx = indices.detach().reshape(-1, indices.shape[-1])
            w = weights.detach().reshape(-1, weights.shape[-1])
            if idx.shape[-1] != k:
                raise RuntimeError(f"{site.name}: router selected {idx.shape[-1]} experts, "
                                   f"expected top-{k}")
            if w.shape[-1] == self.num_experts and k != self.num_experts:
                w = w.gather(1, idx.long())  # a dense [tokens, N] score matrix
            if w.shape != idx.shape:
                raise RuntimeError(f"{site.name}: router weights {tuple(w.shape)} do not align "
                                   f"with indices {tuple(idx.shape)}")
            if self._expected is not None and idx.shape[0] != self._expected:
                raise RuntimeError(f"{site.name}: router saw {idx.shape[0]} token rows, the "
                                   f"batch has {self._expected} (batch x seq)")
            if self._got[i] is not None:
                raise RuntimeError(f"{site.name}: router ran twice in one forward")
            self._got[i] = (idx.cpu().numpy().astype(np.int64, copy=False),
                            w.float().cpu().numpy())

        return hook

    def expect(self, rows: int) -> None:
        self._expected = rows
        self._got = [None] * len(self.sites)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """int64[rows, L, k] expert ids and float32[rows, L, k] weights of the last forward."""
        missing = [s.name for s, g in zip(self.sites, self._got) if g is None]
        if missing:
            raise RuntimeError(f"router {missing[0]} did not run during the forward (a fused "
                               "kernel replacing the MoE block bypasses the router module)")
        ids = np.stack([g[0] for g in self._got], axis=1)
        w = np.stack([g[1] for g in self._got], axis=1)
        self._got = [None] * len(self.sites)
        return ids, w
