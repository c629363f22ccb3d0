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

The home rules themselves live in `schedule.homes`.
"""

from __future__ import annotations

import numpy as np

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


def placement_figures(placement: Placement, experts: np.ndarray, home: np.ndarray) -> dict:
    """LAR, node-local rate, remote copies and load imbalance of `placement` with `home`.

    experts: int[T, L, k] (eval trace); home: int[T, L] device per token and layer.
    """
    serve = serving_device(placement, experts, home)
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
    mean = load.mean(axis=1)
    med = np.median(load, axis=1)
    return {"lar": lar, "lar_mean": float(lar.mean()), "lar_p50": float(np.median(lar)),
            "node_local_rate": float(node_local.mean()),
            "remote_copies_per_token": float(copies.mean()),
            "imbalance_max_mean": float((load.max(axis=1) / np.maximum(mean, 1e-12)).mean()),
            "imbalance_max_median": float((load.max(axis=1) / np.maximum(med, 1e-12)).mean()),
            "load": load}
