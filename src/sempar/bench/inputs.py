"""The inputs of `sempar bench`: the dev trace's splits, prefill batches of its held-out
requests, the single-process reference forward (logits and routing) and the model's shape."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sempar.errors import InputError


def load_dev(model: str):
    """(fit, held-out) splits of the packaged dev trace of `model` (`split_by_request`)."""
    from sempar.paths import assets_dir
    from sempar.trace.io import read_trace
    from sempar.trace.ops import split_by_request

    path = assets_dir() / "traces" / f"{model}.parquet"
    if not path.is_file():
        raise InputError(f"no dev trace for {model} at {path}")
    return split_by_request(read_trace(path))


def prefill_batches(held, batches: int, batch_size: int, seq: int) -> list[torch.Tensor]:
    """`batches` int64[batch_size, seq]: held-out requests with >= seq tokens, in trace order,
    each cut to its first `seq` tokens."""
    order = np.argsort(held.request_id, kind="stable")
    rid = held.request_id[order]
    starts = np.flatnonzero(np.r_[True, rid[1:] != rid[:-1]])
    lens = np.diff(np.r_[starts, rid.size])
    first_seen = np.argsort([order[s] for s in starts], kind="stable")   # trace order
    rows = []
    for i in first_seen:
        if lens[i] >= seq:
            idx = order[starts[i]:starts[i] + lens[i]]
            idx = idx[np.argsort(held.position[idx], kind="stable")][:seq]
            rows.append(held.token_id[idx].astype(np.int64))
    need = batches * batch_size
    if len(rows) < need:
        raise InputError(f"the held-out dev text has {len(rows)} requests of >= {seq} tokens; "
                         f"{batches} x {batch_size} asked for")
    ids = torch.from_numpy(np.stack(rows[:need]))
    return list(ids.view(batches, batch_size, seq))


_MODELS: dict[str, Any] = {}


def reference(model: str, ids: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """(logits float32[B, S, V], experts int64[B*S, L, k]) of the single-process HF forward."""
    from transformers.utils import logging as hf_logging

    from sempar.models import load_model
    from sempar.trace.routers import RoutingCapture, find_routers

    hf_logging.disable_progress_bar()
    if model not in _MODELS:
        _MODELS.clear()
        _MODELS[model] = load_model(model)
    m = _MODELS[model]
    cfg = m.config
    with RoutingCapture(find_routers(m), cfg.num_experts_per_tok,
                        cfg.num_local_experts) as cap, torch.no_grad():
        cap.expect(ids.numel())
        logits = m(input_ids=ids.long()).logits.float()
        experts, _ = cap.take()
    return logits, np.asarray(experts, np.int64)


def batch_trace(meta, ids: torch.Tensor, experts: np.ndarray):
    """The RoutingTrace of one batch (request b = row b, its real routing)."""
    from sempar.trace.schema import RoutingTrace

    B, S = ids.shape
    return RoutingTrace(meta=meta, token_id=ids.reshape(-1).numpy().astype(np.int64),
                        request_id=np.repeat(np.arange(B, dtype=np.int64), S),
                        position=np.tile(np.arange(S, dtype=np.int64), B), experts=experts)


def model_config(model: str) -> dict:
    """config.json of a packaged model name or a model folder."""
    from sempar.models import resolve_model

    from sempar.safe_json import read_json_object

    return read_json_object(resolve_model(model).model_dir / "config.json", "model config.json")


def tp_ok(model: str, G: int) -> bool:
    """Whether `model`'s attention heads split over G ranks (`runtime.tp.heads_split`)."""
    from sempar.runtime.tp import heads_split

    cfg = model_config(model)
    return heads_split(cfg["num_attention_heads"], cfg["num_key_value_heads"], G) is None
