"""Selection agreement of exact pre-routing with the router itself (prerouter.py, issue 16).

`selection_agreement(model, input_ids, world)` runs the model's single-process forward once with
hooks and rebuilds, per MoE layer, what an Attention-TP deployment over `world` ranks would have
before its reduce-scatter: the replicated residual h (the input of `input_layernorm`) and each
rank's partial attention output p_g = A[:, heads of g] · W_o[:, heads of g]ᵀ (+ o_proj's bias on
rank 0), A being o_proj's input (the heads' outputs laid end to end). The pre-router sums the
partial logits W(w ⊙ p_g) + W(w ⊙ h) in rank order (the all-reduce) and selects; the router's
own choice comes from its forward hook. A pair agrees when the two top-k *sets* are equal.

Hooks, not a re-implementation of attention, so every family's attention (GQA, MLA, sinks)
serves as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sempar.errors import InputError
from sempar.families import family
from sempar.schedule.prerouter import PreRouter


def _split_columns(width: int, heads: int, world: int) -> list[slice]:
    if heads % world:
        raise InputError(f"pre-routing: {heads} attention heads do not split over {world} ranks")
    per = width // world
    return [slice(g * per, (g + 1) * per) for g in range(world)]


@torch.no_grad()
def selection_agreement(model: Any, input_ids: torch.Tensor, world: int) -> dict:
    """Pre-routed vs router top-k for one forward of input_ids int64[B, S].

    Returns {"agreement": float (share of (token, layer) pairs with equal sets),
    "per_layer": float[L], "exact": bool (the family is exact by construction),
    "prerouted": int64[B*S, L, k], "router": int64[B*S, L, k],
    "margin": float32[B*S, L] the router's own logit gap between its k-th and (k+1)-th best
    (small gaps are float ties)}.
    """
    mt = model.config.model_type
    fam = family(mt, "pre-routing")
    layers = [ly for ly in model.model.layers if fam.router_of(ly) is not None]
    if not layers:
        raise InputError("pre-routing: the model has no MoE layer")
    heads = int(model.config.num_attention_heads)
    seen: dict[int, dict[str, torch.Tensor]] = {id(ly): {} for ly in layers}
    handles = []
    for ly in layers:
        box = seen[id(ly)]
        handles.append(ly.input_layernorm.register_forward_pre_hook(
            lambda m, a, box=box: box.__setitem__("h", a[0].reshape(-1, a[0].shape[-1]))))
        handles.append(ly.self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, box=box: box.__setitem__("A", a[0].reshape(-1, a[0].shape[-1]))))
        handles.append(fam.router_of(ly).register_forward_hook(
            lambda m, a, out, box=box: box.update(logits=out[0].reshape(-1, out[0].shape[-1]),
                                                  ids=out[2].reshape(out[2].shape[0], -1))))
    try:
        model(input_ids=input_ids)
    finally:
        for h in handles:
            h.remove()
    pre, rout, margin = [], [], []
    for ly in layers:
        box = seen[id(ly)]
        pr = PreRouter.from_layer(ly, mt)
        o = ly.self_attn.o_proj
        A, Wo = box["A"].float(), o.weight.float()
        z = pr.partial_logits(box["h"].float())
        for g, cols in enumerate(_split_columns(A.shape[1], heads, world)):
            p = A[:, cols] @ Wo[:, cols].T
            if g == 0 and o.bias is not None:
                p = p + o.bias.float()
            z = z + pr.partial_logits(p)
        scale = None if pr.exact else pr.residual_scale(box["h"])
        pre.append(pr.select(z, scale).sort(dim=1).values)
        rout.append(box["ids"].long().sort(dim=1).values)
        top = box["logits"].float().topk(pr.top_k + 1, dim=-1).values
        margin.append(top[:, -2] - top[:, -1])
    P, R = torch.stack(pre, 1), torch.stack(rout, 1)
    same = (P == R).all(dim=2)
    return {"agreement": float(same.float().mean()),
            "per_layer": same.float().mean(dim=0).tolist(),
            "exact": fam.prerouting == "exact",
            "prerouted": P.numpy(), "router": R.numpy(),
            "margin": torch.stack(margin, 1).numpy().astype(np.float32)}


_MEASURED: dict[tuple, dict] = {}


def check_vocabulary(trace: Any) -> int | None:
    """The attention heads of the trace's model (one of ours on disk), after refusing a trace
    whose token ids lie beyond that model's vocabulary; None when the model is not on disk.

    The model is run on the trace's own tokens: an id beyond its vocabulary (a trace that names
    the model but was not recorded from it) cannot be embedded."""
    from sempar.paths import packaged_model_dir
    from sempar.safe_json import read_json_object

    d = packaged_model_dir(trace.meta.model)
    if d is None or not any(d.glob("*.safetensors")):
        return None
    cfg = read_json_object(d / "config.json", "model config.json")
    heads, vocab = cfg.get("num_attention_heads"), cfg.get("vocab_size")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, vocab)):
        raise InputError(f"{d / 'config.json'}: num_attention_heads / vocab_size are not "
                         "positive integers")
    top = int(trace.token_id.max()) if trace.num_tokens else -1
    if top >= vocab:
        raise InputError(f"metadata.model: the trace names {trace.meta.model}, whose vocabulary "
                         f"has {vocab} tokens, but holds token id {top}: it was not recorded "
                         "from that model")
    return heads


def trace_agreement(trace: Any, world: int, requests: int = 16) -> dict | None:
    """{"agreement", "tokens", "world"} of the trace's model (one of ours on disk, else None) on
    the first `requests` requests of `trace` in arrival order, each as one prefill sequence as
    recorded. Rank groups: gcd(world, attention heads) (the sum over ranks is what matters;
    a model whose heads do not split over `world` cannot run Attention-TP there anyway).
    Cached per (model, trace content, world)."""
    import math

    from sempar.models import load_model
    from sempar.paths import packaged_model_dir

    d = packaged_model_dir(trace.meta.model)
    if d is None or not any(d.glob("*.safetensors")):
        return None
    _, first = np.unique(trace.request_id, return_index=True)
    reqs = trace.request_id[np.sort(first)[:requests]]
    heads = check_vocabulary(trace)
    w = math.gcd(world, heads)
    key = (str(trace.meta.model), int(trace.num_tokens), tuple(int(r) for r in reqs), w)
    if key not in _MEASURED:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model = load_model(d)
        agree, n = 0.0, 0
        for r in reqs:
            rows = np.flatnonzero(trace.request_id == r)
            rows = rows[np.argsort(trace.position[rows], kind="stable")]
            ids = torch.as_tensor(trace.token_id[rows].astype(np.int64))[None]
            res = selection_agreement(model, ids, w)
            agree += res["agreement"] * rows.size
            n += rows.size
        _MEASURED[key] = {"agreement": agree / max(n, 1), "tokens": n, "world": w}
    return _MEASURED[key]
