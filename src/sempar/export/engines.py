"""Placement files that serving engines load, and readers that round-trip them.

- SGLang `--init-expert-location`: `{"physical_to_logical_map": [[...], ...]}`, one row per
  hidden layer of the model (`num_hidden_layers`, dense layers included: their rows hold the
  contiguous layout, which SGLang ignores for a dense layer but requires to be well-formed),
  every row the same length (divisible by the EP size) and holding every logical expert.
- vLLM-style maps: `physical_to_logical_map[L][P]`, `logical_to_physical_map[L][N][maxcnt]`
  padded with -1, `logical_replica_count[L][N]` (the shapes of vLLM's EPLB state), per MoE layer.
- vllm-ascend `expert_map` JSON: `{"moe_layer_count": L, "layer_list": [{"layer_id": l,
  "device_count": G, "device_list": [{"device_id": g, "device_expert": [...]}]}]}`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from sempar.atomic import write_text_atomic
from sempar.errors import InputError
from sempar.placement.placement import Placement


def _layer_ids(p: Placement) -> list[int]:
    return [int(i) for i in p.info.get("layer_ids", range(p.num_layers))]


def to_sglang(p: Placement, num_hidden_layers: int | None = None) -> dict:
    ids = _layer_ids(p)
    total = num_hidden_layers if num_hidden_layers is not None else max(ids) + 1
    if total <= max(ids):
        raise InputError(f"--num-hidden-layers: {total} but the placement names MoE layer {max(ids)}")
    dense = np.resize(np.arange(p.num_experts), p.num_slots)  # contiguous, wraps for replicas
    rows = [dense.tolist() for _ in range(total)]
    for l, model_layer in enumerate(ids):
        rows[model_layer] = p.phy2log[l].tolist()
    return {"physical_to_logical_map": rows}


def from_sglang(d: dict, num_devices: int, moe_layers: list[int]) -> Placement:
    if set(d) != {"physical_to_logical_map"}:
        raise InputError(f"sglang placement: keys {sorted(d)} are not exactly physical_to_logical_map")
    rows = np.asarray(d["physical_to_logical_map"])
    phy = rows[moe_layers]
    return Placement(phy, int(phy.max()) + 1, num_devices).validate()


def to_vllm(p: Placement) -> dict:
    return {"physical_to_logical_map": p.phy2log.tolist(),
            "logical_to_physical_map": p.log2phy().tolist(),
            "logical_replica_count": p.logcnt().tolist()}


def from_vllm(d: dict, num_devices: int) -> Placement:
    p = Placement(np.asarray(d["physical_to_logical_map"]),
                  len(d["logical_replica_count"][0]), num_devices).validate()
    if not (np.array_equal(p.log2phy(), np.asarray(d["logical_to_physical_map"]))
            and np.array_equal(p.logcnt(), np.asarray(d["logical_replica_count"]))):
        raise InputError("vllm placement: the three maps disagree")
    return p


def to_vllm_ascend(p: Placement) -> dict:
    return {"moe_layer_count": p.num_layers, "layer_list": [
        {"layer_id": l, "device_count": p.num_devices,
         "device_list": [{"device_id": g, "device_expert": p.slots(l)[g].tolist()}
                         for g in range(p.num_devices)]}
        for l in range(p.num_layers)]}


def from_vllm_ascend(d: dict) -> Placement:
    layers = d["layer_list"]
    G = layers[0]["device_count"]
    phy = np.asarray([[e for dev in layer["device_list"] for e in dev["device_expert"]]
                      for layer in layers])
    if len(layers) != d["moe_layer_count"]:
        raise InputError("vllm-ascend expert map: moe_layer_count disagrees with layer_list")
    return Placement(phy, int(phy.max()) + 1, G).validate()


WRITERS = {"sglang": to_sglang, "vllm": to_vllm, "vllm-ascend": to_vllm_ascend}


def write_engine_file(p: Placement, engine: str, out: str | os.PathLike,
                      num_hidden_layers: int | None = None) -> Path:
    if engine not in WRITERS:
        raise InputError(f"--to: {engine!r} is not one of {', '.join(WRITERS)}, hf-checkpoint")
    d = to_sglang(p, num_hidden_layers) if engine == "sglang" else WRITERS[engine](p)
    write_text_atomic(out, json.dumps(d) + "\n")
    return Path(out)
