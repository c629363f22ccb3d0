"""The model-layout fields a trace's metadata and a placement's `info` share, checked in one place.

`layer_ids` (which of the model's decoder layers the L MoE columns / placement rows are),
`num_hidden_layers` (the model's decoder-layer count, dense layers included), `model_type`
(HF `config.model_type`) and `num_expert_groups` come from files the user gives; an engine file
is indexed by them (`export --to sglang` writes one row per hidden layer at the MoE layers'
numbers, vLLM takes rows by position). So each is typed and bounded exactly like the flag that
sets it (`--num-hidden-layers`: `sempar.bounds.LAYERS_MAX`), and `layer_ids` must be L distinct
layer numbers in increasing (model) order inside [0, num_hidden_layers): a negative, short,
repeated or unordered list would put rows on the wrong layers of the engine file.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sempar.bounds import EXPERTS_MAX, LAYERS_MAX
from sempar.errors import InputError

MODEL_TYPE_MAX = 128        # characters of an HF model_type (sempar.families names them)


def is_int(v: Any) -> bool:
    """A JSON / numpy integer, not a bool (True is an int to Python, not a count to us)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_layer_ids(where: str, ids: Any, num_layers: int) -> tuple[int, ...]:
    """`ids` as a tuple after checking: a list of `num_layers` distinct layer numbers in
    [0, LAYERS_MAX), increasing. `where`: the field's name in messages."""
    if isinstance(ids, (str, bytes, dict)) or not hasattr(ids, "__len__"):
        raise InputError(f"{where}: {ids!r} is not a list of layer numbers")
    for i in ids:
        if not is_int(i) or not 0 <= i < LAYERS_MAX:
            raise InputError(f"{where}: {i!r} is not a layer number 0..{LAYERS_MAX - 1}")
    out = tuple(int(i) for i in ids)
    if len(out) != num_layers:
        raise InputError(f"{where}: {len(out)} ids for {num_layers} layers")
    if len(set(out)) != len(out):
        dup = next(i for i in out if out.count(i) > 1)
        raise InputError(f"{where}: layer {dup} is listed twice")
    if list(out) != sorted(out):
        raise InputError(f"{where}: {list(out)[:16]} is not in increasing (model) order")
    return out


def check_num_hidden_layers(where: str, n: Any, layers: tuple[int, ...]) -> int:
    """`n` after checking: an integer in [len(layers), LAYERS_MAX] above every MoE layer id."""
    if not is_int(n) or not len(layers) <= n <= LAYERS_MAX:
        raise InputError(f"{where}: {n!r} is not an integer in [{len(layers)}, {LAYERS_MAX}] "
                         f"(the {len(layers)} MoE layers .. the limit of --num-hidden-layers)")
    if layers and max(layers) >= n:
        ids = where.replace("num_hidden_layers", "layer_ids")
        raise InputError(f"{ids}: MoE layer {max(layers)} is beyond the model's {n} layers "
                         f"({where.rsplit('.', 1)[-1]})")
    return int(n)


def check_model_type(where: str, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not 0 < len(v) <= MODEL_TYPE_MAX or not v.isprintable():
        raise InputError(f"{where}: {_short(v)} is not a model type name (a printable string "
                         f"of at most {MODEL_TYPE_MAX} characters)")
    return v


def check_expert_groups(where: str, v: Any, num_experts: int) -> int:
    if not is_int(v) or not 1 <= v <= EXPERTS_MAX or num_experts % int(v):
        raise InputError(f"{where}: {_short(v)} does not divide num_experts {num_experts}")
    return int(v)


def check_placement_info(info: Any, num_layers: int, num_experts: int) -> dict[str, Any]:
    """A placement file's `info` after checking its layout fields (the others are provenance,
    which no reader acts on): `layer_ids`, `num_hidden_layers`, `model_type`,
    `num_expert_groups`, `model`. Absent fields stay absent (the reader's defaults apply)."""
    if not isinstance(info, dict):
        raise InputError(f"placement.info: {_short(info)} is not an object")
    out = dict(info)
    layers = tuple(range(num_layers))
    if "layer_ids" in out:
        layers = out["layer_ids"] = list(check_layer_ids("placement.info.layer_ids",
                                                         out["layer_ids"], num_layers))
    if out.get("num_hidden_layers") is not None:
        out["num_hidden_layers"] = check_num_hidden_layers("placement.info.num_hidden_layers",
                                                           out["num_hidden_layers"], tuple(layers))
    if "model_type" in out:
        check_model_type("placement.info.model_type", out["model_type"])
    if "num_expert_groups" in out:
        check_expert_groups("placement.info.num_expert_groups", out["num_expert_groups"],
                            num_experts)
    if "model" in out and not isinstance(out["model"], str):
        raise InputError(f"placement.info.model: {_short(out['model'])} is not a model name")
    return out


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."
