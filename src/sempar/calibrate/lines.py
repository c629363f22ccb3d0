"""Measurement lines: one JSON object per line, the schema of `shared/data/h100-kernels/*.jsonl`
(what `sempar calibrate` writes beside its profile and `sempar calibrate check` reads).

- a header line without `measured_us`: {"device": ..., "torch": ...} (kept as metadata);
- MoE block: {"model", "ep", "E", "T", "tokens", "measured_us", ...}: T token-expert copies on one
  EP rank holding E experts (`part` "moe block" optional);
- {"model", "part": "attention layer", "phase": "decode" | "prefill", "tokens", "context",
  "measured_us"}; {"model", "part": "lm head", "tokens", "measured_us"};
  {"model", "part": "dense mlp", "tokens", "measured_us"} (ours).

Models are named by the preset table (`model_dims`, the one place this package reads it);
lines carrying `dims` (ModelDims fields: `sempar calibrate --model-dir`) need no preset. Lines
with `error` (a case the device refused) are skipped.
"""

from __future__ import annotations

import math
from pathlib import Path

from sempar.errors import InputError
from sempar.serving.dims import DIMS, ModelDims, check_dims

PART_OPS = {"moe block": "moe_block", "attention layer": "attention", "lm head": "lm_head",
            "dense mlp": "dense_mlp"}
MAX_LINES = 100_000


def preset_models() -> list[ModelDims]:
    """The models of the preset table whose shapes `sempar calibrate` measures."""
    return list(DIMS.values())


def model_dims(name: str) -> ModelDims:
    from sempar.serving.dims import model_dims as lookup

    return lookup(name)


MEASUREMENTS_BYTES_MAX = 64 << 20       # a measurements file (the full H100 grid: ~1 MB)
LINE_BYTES_MAX = 1 << 16                # one measurement line (with its dims: ~500 bytes)


def _dims(line: dict, where: str) -> ModelDims:
    d = line.get("dims")
    if isinstance(d, dict):
        try:
            mla = d.get("mla")
            dims = ModelDims(**{**d, "mla": tuple(mla) if isinstance(mla, list) else mla})
        except TypeError:
            raise InputError(f"{where}: dims is not a ModelDims object") from None
        return check_dims(dims, f"{where}: dims")
    if not isinstance(line.get("model"), str):
        raise InputError(f"{where}: no model name")
    return model_dims(line["model"])


def _num(line: dict, key: str, where: str, integer: bool = True):
    v = line.get(key)
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if not ok or isinstance(v, bool) or not (math.isfinite(v) and 0 < v < 2 ** 40):
        raise InputError(f"{where}: {key} must be a positive {'integer' if integer else 'number'}")
    return v


def to_point(line: dict, where: str) -> dict:
    """A measured point {op, model, dims, tokens, measured_us, experts_per_rank | phase,
    context} of one line (accel_profile.build_profile's input)."""
    dims = _dims(line, where)
    m = float(_num(line, "measured_us", where, integer=False))
    if "T" in line or "ep" in line:
        E, T = _num(line, "E", where), _num(line, "T", where)
        if E > dims.num_experts:
            raise InputError(f"{where}: E {E} experts on a rank of a model with "
                             f"{dims.num_experts}")
        return {"op": "moe_block", "model": dims.name, "dims": dims, "experts_per_rank": E,
                "tokens": T, "measured_us": m}
    part = line.get("part")
    op = PART_OPS.get(part) if isinstance(part, str) else None
    if op is None:
        raise InputError(f"{where}: part {line.get('part')!r} is not one of {', '.join(PART_OPS)}")
    p = {"op": op, "model": dims.name, "dims": dims, "tokens": _num(line, "tokens", where),
         "measured_us": m}
    if op == "attention":
        if line.get("phase") not in ("decode", "prefill"):
            raise InputError(f"{where}: phase must be decode or prefill")
        p.update(phase=line["phase"], context=_num(line, "context", where))
    return p


def read_lines(path: str | Path) -> tuple[dict, list[tuple[dict, dict]]]:
    """(header, [(line, point)]) of a measurements file; InputError naming a bad line."""
    from sempar.output_rule import check_input

    from sempar.safe_json import json_lines

    p = check_input(path, "measurements file")
    size = p.stat().st_size
    if size > MEASUREMENTS_BYTES_MAX:
        raise InputError(f"{path}: {size} bytes is above the limit {MEASUREMENTS_BYTES_MAX} "
                         "for a measurements file")
    header: dict = {}
    out = []
    try:
        f = open(p, "rb")
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror or err})") from None
    with f:       # each line size- and depth-checked before it is parsed (safe_json)
        for i, _raw, line in json_lines(f, str(path), LINE_BYTES_MAX):
            if i > MAX_LINES:
                raise InputError(f"{path}: more than {MAX_LINES} lines")
            if not isinstance(line, dict):
                raise InputError(f"{path}:{i}: not a JSON object")
            if "error" in line:
                continue
            if "measured_us" not in line:
                header.update({k: v for k, v in line.items() if isinstance(v, (str, int, float))})
                continue
            out.append((line, to_point(line, f"{path}:{i}")))
    if not out:
        raise InputError(f"{path}: no measurement lines")
    return header, out


def line_of(point: dict, measured_us: float, with_dims: bool = False) -> dict:
    """The measurement line (this module's schema) of a measured point."""
    d = point["dims"]
    if point["op"] == "moe_block":
        E = point["experts_per_rank"]
        line = {"model": d.name, "part": "moe block", "ep": max(1, d.num_experts // E), "E": E,
                "T": int(point["tokens"]), "tokens": max(1, int(point["tokens"]) // d.top_k)}
    else:
        line = {"model": d.name, "part": {v: k for k, v in PART_OPS.items()}[point["op"]]}
        if point["op"] == "attention":
            line["phase"] = point["phase"]
        line["tokens"] = int(point["tokens"])
        if point["op"] == "attention":
            line["context"] = point["context"]
    if with_dims:
        from dataclasses import asdict
        line["dims"] = asdict(d)
    return {**line, "measured_us": round(float(measured_us), 2)}


def dims_from_dir(folder: str | Path) -> ModelDims:
    """ModelDims of a checkpoint folder's config.json (`sempar calibrate --model-dir`): GQA
    configs (Mixtral, Qwen3-MoE, OLMoE, GPT-OSS) and DeepSeek's MLA ones."""
    from sempar.output_rule import check_input
    from sempar.safe_json import read_json_object

    d = check_input(folder, "--model-dir", folder=True)
    c = read_json_object(d / "config.json", "model config.json")
    try:
        h, nh = int(c["hidden_size"]), int(c["num_attention_heads"])
        layers = int(c["num_hidden_layers"])
        dense = int(c.get("first_k_dense_replace") or len(c.get("mlp_only_layers") or []))
        N = int(c.get("n_routed_experts") or c.get("num_local_experts") or c.get("num_experts"))
        k = int(c["num_experts_per_tok"])
        mla = None
        if c.get("kv_lora_rank"):
            mla = (int(c.get("q_lora_rank") or 0), int(c["kv_lora_rank"]),
                   int(c["qk_rope_head_dim"]), int(c["qk_nope_head_dim"]))
        hd = int(c.get("v_head_dim") or c.get("head_dim") or h // nh)
        dims = ModelDims(Path(d).name, h, nh, int(c.get("num_key_value_heads") or nh), hd,
                         int(c.get("moe_intermediate_size") or c["intermediate_size"]),
                         layers - dense, dense, int(c.get("intermediate_size") or 0) if dense else 0,
                         int(c["vocab_size"]), N, k, int(c.get("n_shared_experts") or 0),
                         mla=mla)
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise InputError(f"--model-dir {folder}: config.json lacks a MoE shape field ({e})") from None
    return check_dims(dims, f"--model-dir {folder}: config.json")
