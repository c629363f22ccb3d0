"""Placement files that serving engines load, the launch flags that go with them, and readers.

Each format is registered once in `ENGINES` with what the engine needs to read it as meant:

- `sglang` (SGLang >= 0.4.7, checked against 0.5.23's `srt/eplb/expert_location.py`):
  `--init-expert-location FILE` with `{"physical_to_logical_map": [[...], ...]}`, ONE ROW PER
  HIDDEN LAYER of the model (`num_hidden_layers`): `ExpertLocationDispatchInfo.init_new(layer_id)`
  reads row `layer_id`, the model's own layer number, so the MoE rows sit at their layer numbers
  and the dense rows (DeepSeek's first `first_k_dense_replace` layers) hold the contiguous layout,
  which SGLang never reads for a dense layer. Every row has `num_logical +
  --ep-num-redundant-experts` columns, rank r holding columns [r*S, (r+1)*S) with S = columns /
  `--ep-size`. SGLang does not check the width against its flags (it silently misplaces experts
  launched with another `--ep-size` / `--ep-num-redundant-experts`), and reads a file only when
  the argument ends in `.json` or `.pt` (else it parses the argument as JSON text): the flags are
  printed with the file, and other names are refused. Models without
  `get_model_config_for_expert_location` in SGLang (Mixtral, OLMoE) cannot take a placement:
  refused by `model_type`.
- `vllm` (vLLM PR #49572, open; no vLLM release up to 0.33.0 loads an initial placement):
  `eplb_config.initial_expert_map_path` naming a bare JSON list `[L][P]`, one row per MoE layer
  in the model's order (layer numbers are not written: vLLM takes MoE layers by position). It
  goes through vLLM's EPLB, which only models implementing `MixtureOfExperts` have (0.33.0: not
  OLMoE, Qwen2-MoE, GPT-OSS: refused).
- `vllm-maps`: vLLM's EPLB state (`physical_to_logical_map[L][P]`, `logical_to_physical_map
  [L][N][maxcnt]` padded with -1, `logical_replica_count[L][N]`, as `compute_logical_maps`
  derives them): a debugging aid, no vLLM loads it.
- `vllm-ascend` (`additional_config.eplb_config.expert_map_path`, path ending in `.json`):
  `{"moe_layer_count": L, "layer_list": [{"layer_id": l, "device_count": G, "device_list":
  [{"device_id": g, "device_expert": [...]}]}]}`; layers are taken by position (`layer_id` is
  not read), `ep_size` must be G and `num_redundant_experts` R.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sempar.atomic import write_text_atomic
from sempar.errors import InputError
from sempar.families import refused_by
from sempar.placement.placement import Placement
from sempar.registry import Registry


@dataclass(frozen=True)
class ModelLayout:
    """Which of a model's `num_hidden_layers` decoder layers the placement's L rows are."""

    num_hidden_layers: int
    moe_layer_ids: tuple[int, ...]   # L distinct ids in [0, num_hidden_layers)


def model_layout(p: Placement, num_hidden_layers: int | None = None,
                 first_k_dense_replace: int | None = None) -> ModelLayout:
    """The placement's layer layout: from its `info` (set from the trace it was solved on) or,
    for a placement that does not record it, from `--num-hidden-layers` (and
    `--first-k-dense-replace` when some layers are dense). Unknown or inconsistent: InputError."""
    L = p.num_layers
    known = p.info.get("num_hidden_layers")
    if known is not None:
        ids = tuple(int(i) for i in p.info.get("layer_ids", range(L)))
        for flag, value, expect in (("--num-hidden-layers", num_hidden_layers, int(known)),
                                    ("--first-k-dense-replace", first_k_dense_replace, min(ids))):
            if value is not None and value != expect:
                raise InputError(f"{flag} {value}: the placement's model has {expect} "
                                 f"(MoE layers {ids[0]}..{ids[-1]} of {known})")
        return ModelLayout(int(known), ids)
    if num_hidden_layers is None:
        raise InputError("sglang: the placement does not record the model's layer layout (solve "
                         "it on a trace from synth, record or import); pass --num-hidden-layers "
                         "N, and --first-k-dense-replace K if the first K layers are dense")
    if first_k_dense_replace is None and num_hidden_layers != L:
        raise InputError(f"--num-hidden-layers {num_hidden_layers}: the placement has {L} MoE "
                         "layers; pass --first-k-dense-replace K to say which layers are dense")
    k = first_k_dense_replace or 0
    if k < 0 or k + L != num_hidden_layers:
        raise InputError(f"--first-k-dense-replace {k}: {k} dense + {L} MoE layers of the "
                         f"placement is not --num-hidden-layers {num_hidden_layers}")
    return ModelLayout(num_hidden_layers, tuple(range(k, num_hidden_layers)))


def to_sglang(p: Placement, layout: ModelLayout) -> dict:
    """`{"physical_to_logical_map": int[num_hidden_layers][P]}` (module docstring)."""
    from sempar.bounds import SGLANG_MAP_ENTRIES_MAX

    entries = layout.num_hidden_layers * p.num_slots
    if entries > SGLANG_MAP_ENTRIES_MAX:
        raise InputError(f"sglang: {layout.num_hidden_layers} hidden layers x {p.num_slots} slots "
                         f"is {entries} map entries, above the limit {SGLANG_MAP_ENTRIES_MAX}")
    dense = np.resize(np.arange(p.num_experts), p.num_slots)  # contiguous, wraps for replicas
    rows = [dense.tolist() for _ in range(layout.num_hidden_layers)]
    for l, model_layer in enumerate(layout.moe_layer_ids):
        rows[model_layer] = p.phy2log[l].tolist()
    return {"physical_to_logical_map": rows}


def from_sglang(d: dict, num_devices: int, moe_layers: list[int]) -> Placement:
    if set(d) != {"physical_to_logical_map"}:
        raise InputError(f"sglang placement: keys {sorted(d)} are not exactly physical_to_logical_map")
    rows = np.asarray(d["physical_to_logical_map"])
    phy = rows[moe_layers]
    return Placement(phy, int(phy.max()) + 1, num_devices).validate()


def to_vllm(p: Placement) -> list:
    """vLLM PR #49572's `initial_expert_map_path` content: int[L][P], MoE layers in order."""
    return p.phy2log.tolist()


def from_vllm(d: list, num_devices: int) -> Placement:
    phy = np.asarray(d)
    if phy.ndim == 1:  # one map shared by every MoE layer
        phy = phy[None]
    return Placement(phy, int(phy.max()) + 1, num_devices).validate()


def to_vllm_maps(p: Placement) -> dict:
    return {"physical_to_logical_map": p.phy2log.tolist(),
            "logical_to_physical_map": p.log2phy().tolist(),
            "logical_replica_count": p.logcnt().tolist()}


def from_vllm_maps(d: dict, num_devices: int) -> Placement:
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


# --------------------------------------------------------------------------- engine flags

def _sglang_flags(p: Placement, path: Path) -> list[str]:
    return ["--ep-size", str(p.num_devices), "--ep-num-redundant-experts", str(p.redundant),
            "--init-expert-location", str(path)]


def _vllm_flags(p: Placement, path: Path) -> list[str]:
    cfg = {"num_redundant_experts": p.redundant, "initial_expert_map_path": str(path)}
    return ["--enable-expert-parallel", "--enable-eplb", "--eplb-config", json.dumps(cfg)]


def vllm_plugin_launch(p: Placement, placement: Path) -> dict[str, Any]:
    """How released vLLM (no initial map) gets placement `p`: through sempar's EPLB plug-in
    (docs/eplb-plugin.md), whose first rebalance lays the experts out from the placement JSON.
    {"env": {...}, "flags": [...], "versions": str}."""
    cfg = {"num_redundant_experts": p.redundant}
    return {"env": {"SEMPAR_EPLB": str(Path(placement).absolute())},
            "flags": ["--enable-expert-parallel", "--enable-eplb", "--eplb-config",
                      json.dumps(cfg)],
            "versions": "vLLM 0.33.0 with `pip install sempar` (entry point vllm.general_plugins: "
                        "sempar); the placement is in place from the first rebalance "
                        "(eplb step_interval x 3/4 forward steps after start)"}


def _ascend_flags(p: Placement, path: Path) -> list[str]:
    cfg = {"eplb_config": {"expert_map_path": str(path), "num_redundant_experts": p.redundant}}
    return ["--enable-expert-parallel", "--additional-config", json.dumps(cfg)]


@dataclass(frozen=True)
class EngineFormat:
    """One engine's placement file: how it is written, named, launched, and what it refuses."""

    write: Callable[..., Any]                   # (placement[, layout]) -> JSON value
    suffixes: tuple[str, ...]                   # file names the engine reads as a file
    flags: Callable[[Placement, Path], list[str]] | None
    versions: str                               # which engine versions load it
    ep_size_note: str = ""                      # how the engine's EP size must be set
    cannot_place: frozenset[str] = field(default_factory=frozenset)  # HF model_types
    # (declared per family: sempar.families, Family.no_placement_in)


ENGINES: Registry[EngineFormat] = Registry("export engine")
ENGINES.add("sglang", EngineFormat(
    to_sglang, (".json",), _sglang_flags, "SGLang >= 0.4.7 (checked: 0.5.23)",
    cannot_place=refused_by("sglang")))
ENGINES.add("vllm", EngineFormat(
    to_vllm, (".json",), _vllm_flags,
    "vLLM with PR #49572 (open; no release up to 0.33.0 loads an initial placement)",
    ep_size_note="EP size = tensor-parallel-size x data-parallel-size must be {G}",
    cannot_place=refused_by("vllm")))
ENGINES.add("vllm-maps", EngineFormat(
    to_vllm_maps, (".json",), None, "none: vLLM's EPLB state maps, a debugging aid"))
ENGINES.add("vllm-ascend", EngineFormat(
    to_vllm_ascend, (".json",), _ascend_flags,
    "vllm-ascend with eplb_config.expert_map_path (loader checked by hand at main 182b75e)",
    ep_size_note="EP size = tensor-parallel-size x data-parallel-size must be {G}"))


@dataclass(frozen=True)
class Exported:
    """What `write_engine_file` wrote and how to launch the engine with it."""

    engine: str
    path: Path
    flags: list[str]
    versions: str
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "path": str(self.path), "flags": self.flags,
                "versions": self.versions, "notes": self.notes}


def check_exportable(p: Placement, engine: str, out: str | os.PathLike) -> EngineFormat:
    """The engine's format, after refusing a name it would misread or a model it cannot place."""
    if engine not in ENGINES:
        raise InputError(f"--to: {engine!r} is not one of {', '.join(ENGINES)}, hf-checkpoint")
    fmt = ENGINES.get(engine)
    name = Path(out).name
    if not name.endswith(fmt.suffixes):
        raise InputError(f"--out {name}: {engine} reads the placement only from a file whose "
                         f"name ends in {' or '.join(fmt.suffixes)}")
    model_type = p.info.get("model_type")
    if model_type in fmt.cannot_place:
        raise InputError(f"--to {engine}: {engine} cannot place the experts of {model_type} "
                         f"models (cannot place: {', '.join(sorted(fmt.cannot_place))})")
    return fmt


def write_engine_file(p: Placement, engine: str, out: str | os.PathLike,
                      num_hidden_layers: int | None = None,
                      first_k_dense_replace: int | None = None) -> Exported:
    """Write `p` for `engine` to `out` (atomically); return the flags to launch it with."""
    fmt = check_exportable(p, engine, out)
    if engine != "sglang" and (num_hidden_layers, first_k_dense_replace) != (None, None):
        raise InputError(f"--num-hidden-layers / --first-k-dense-replace: only for --to sglang "
                         f"({engine} takes the MoE layers by position)")
    if engine == "sglang":
        d = to_sglang(p, model_layout(p, num_hidden_layers, first_k_dense_replace))
    else:
        d = fmt.write(p)
    path = Path(out).absolute()
    write_text_atomic(path, json.dumps(d) + "\n")
    notes = []
    if fmt.ep_size_note:
        notes.append(fmt.ep_size_note.format(G=p.num_devices))
    if p.info.get("model_type") is None and fmt.cannot_place:
        notes.append(f"model type unknown: {engine} cannot place "
                     f"{', '.join(sorted(fmt.cannot_place))} models")
    return Exported(engine, path, fmt.flags(p, path) if fmt.flags else [], fmt.versions, notes)
