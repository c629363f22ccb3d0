"""Figures of a placement given where each token sits (docs/design.md, Vocabulary and definitions).

`home[t, l]` is the device holding token t's hidden state when layer l's router runs. The
figures:

- **LAR** per layer: the share of (token, selected expert) activations whose expert has a
  replica on the token's home device.
- **node-local rate**: the same with "on the home device's node".
- **remote copies** (de-duplicated): per (token, layer) the number of distinct devices other
  than home that must receive the token, the nearest replica of each selected expert chosen
  (home, else a replica on home's node, else the lowest device id hosting it: `placement.serving`);
  reported per token per layer.
- **load**: activations each device computes, every activation served by the replica chosen as
  above; **imbalance** per layer = max / mean and max / median over devices.
- **dispatch** (issue 45): with replicas, which copy serves an activation is the dispatch rule's
  choice (`placement.dispatch.DISPATCH`): the rule named in the call, else the placement's own
  (`info["dispatch"]`, set by `place --dispatch`), else `nearest` (the rule above); per-batch
  rules see each engine step's tokens together (`step_batches`). All figures are after
  dispatch; **batch imbalance** is the mean over (step, layer) of max / mean device load within
  the step, the figure lockstep EP pays (the imbalance above is over the whole trace).

The home rules themselves live in `schedule.homes`.
"""

from __future__ import annotations

import numpy as np

from sempar.placement.capacity import BATCH
from sempar.placement.dispatch import DEFAULT_DISPATCH, dispatch_all
from sempar.placement.placement import Placement
from sempar.placement.serving import serve, serving_tables


def serving_device(placement: Placement, experts: np.ndarray, home: np.ndarray) -> np.ndarray:
    """int32[T, L, k]: the device whose replica serves each activation (`placement.serving`'s node
    order: home, else home's node, else the lowest id). experts: int[T, L, k]; home: int[T, L]."""
    tables = serving_tables(placement)                          # [L, G, N]
    out = np.empty(experts.shape, np.int32)
    for l in range(experts.shape[1]):
        out[:, l] = serve(tables[l], home[:, l], experts[:, l])
    return out


def dispatch_rule(placement: Placement, rule: str | None = None) -> str:
    """The dispatch rule figures use: `rule`, else the placement's own, else `nearest`."""
    return rule or str(placement.info.get("dispatch") or DEFAULT_DISPATCH)


def step_batches(home: np.ndarray, num_devices: int, batch: int = BATCH) -> np.ndarray:
    """int64[T]: the engine step of each token: its row among the tokens homed on its device
    (layer 0's home int[T, L], trace order) // (batch / G), every device taking batch / G
    tokens per step in lockstep (tp mode's equal shares: the token's batch of `batch`)."""
    h = np.asarray(home)[:, 0].astype(np.int64)
    order = np.argsort(h, kind="stable")
    hs = h[order]
    row = np.empty(h.size, np.int64)
    row[order] = np.arange(h.size) - np.searchsorted(hs, hs, side="left")
    return row // max(1, batch // num_devices)


def served_devices(placement: Placement, experts: np.ndarray, home: np.ndarray,
                   dispatch: str | None = None, batch: np.ndarray | None = None) -> np.ndarray:
    """int32[T, L, k]: the device serving each activation under `dispatch_rule` (placement
    without replicas: every rule gives the one host); batch int[T] (None: `step_batches`)."""
    rule = dispatch_rule(placement, dispatch)
    if rule == DEFAULT_DISPATCH or placement.redundant == 0:
        return serving_device(placement, experts, home)
    if batch is None:
        batch = step_batches(home, placement.num_devices)
    return dispatch_all(placement, experts, home, rule, batch)


def peak_ratio(load: np.ndarray) -> np.ndarray:
    """float64[...]: max / mean over the last axis of device loads float[..., G] (a zero mean
    counts as 1e-12): the one imbalance figure every module reports, per layer or scenario."""
    load = np.asarray(load, np.float64)
    return load.max(axis=-1) / np.maximum(load.mean(axis=-1), 1e-12)


def batch_imbalance(serve: np.ndarray, batch: np.ndarray, num_devices: int) -> float:
    """Mean over (step, layer) of max / mean device load within the step; serve int[T, L, k],
    batch int[T]."""
    T, L, k = serve.shape
    b = np.unique(np.asarray(batch), return_inverse=True)[1].reshape(-1)
    B, G = int(b.max()) + 1 if T else 0, num_devices
    key = (b[:, None, None] * L + np.arange(L)[None, :, None]) * G + serve
    load = np.bincount(key.ravel(), minlength=B * L * G).reshape(B * L, G).astype(float)
    mean = load.mean(axis=1)
    ok = mean > 0
    return float((load[ok].max(axis=1) / mean[ok]).mean()) if ok.any() else 1.0


def placement_figures(placement: Placement, experts: np.ndarray, home: np.ndarray,
                      dispatch: str | None = None, batch: np.ndarray | None = None) -> dict:
    """LAR, node-local rate, remote copies and load imbalance of `placement` with `home`, every
    activation served by the copy `dispatch` chooses (module docstring).

    experts: int[T, L, k] (eval trace); home: int[T, L] device per token and layer; batch:
    int[T] the engine step of each token (None: `step_batches`).
    """
    if batch is None:
        batch = step_batches(home, placement.num_devices)
    serve = served_devices(placement, experts, home, dispatch, batch)
    local = serve == home[:, :, None]
    lar = local.mean(axis=(0, 2))
    node = placement.node_of
    node_local = (node[serve] == node[home][:, :, None]).mean(axis=(0, 2))
    srt = np.sort(np.where(local, -1, serve), axis=2)
    distinct = (srt >= 0) & np.concatenate([np.ones_like(srt[:, :, :1], bool),
                                            srt[:, :, 1:] != srt[:, :, :-1]], axis=2)
    copies = distinct.sum(axis=2)
    G, L = placement.num_devices, experts.shape[1]
    key = np.arange(L)[None, :, None] * G + serve
    load = np.bincount(key.ravel(), minlength=L * G).reshape(L, G).astype(float)
    med = np.median(load, axis=1)
    return {"lar": lar, "lar_mean": float(lar.mean()), "lar_p50": float(np.median(lar)),
            "node_local_rate": float(node_local.mean()),
            "remote_copies_per_token": float(copies.mean()),
            "imbalance_max_mean": float(peak_ratio(load).mean()),
            "imbalance_max_median": float((load.max(axis=1) / np.maximum(med, 1e-12)).mean()),
            "batch_imbalance_max_mean": batch_imbalance(serve, batch, G),
            "dispatch": dispatch_rule(placement, dispatch),
            "load": load}
