"""A permuted HF checkpoint: Sem-MoE's transparent expert shuffle (Sem-MoE Appendix B).

For every MoE layer the experts are renumbered so that the experts the placement puts on device
g become the contiguous block g (new expert j = old expert `phy2log[l, j]`), and the router's
rows (and any per-expert bias: DeepSeek-V3's `e_score_correction_bias`, GPT-OSS's router bias)
are permuted the same way. An engine's default contiguous EP split then realises the placement
with no engine change, and the model computes the same function: the router picks the same
experts under new names. Replicas cannot be written this way (a checkpoint holds each expert
once): refused.

Tensors are matched by name across all safetensors shards: `...layers.<i>.<block>.experts.<j>.
<rest>` (one tensor per expert, renamed; it stays in its shard and `model.safetensors.index.json`
is rewritten to the new names), fused `...layers.<i>.<block>.experts.<name>` with N rows
(rows permuted), and the router `...layers.<i>.<block>.gate.weight` / `.e_score_correction_bias`
or `...layers.<i>.<block>.router.weight` / `.bias` with N rows. A placement layer whose experts
are found but whose router is not, or an `experts` tensor of another shape, is refused: the
output would silently be another model.

Expert groups (DeepSeek-V3: `n_group` groups of consecutive expert ids, each token routed within
its best `topk_group` groups): renumbering an expert into another group changes which experts a
token can reach, so the model changes. A placement that moves an expert across groups is refused
(`groups_crossed`); solve with `sempar place --preserve-groups` for such models.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np

from sempar.atomic import MARKER, atomic_folder
from sempar.bounds import EXPERTS_MAX
from sempar.errors import InputError
from sempar.models import SAFETENSORS_INDEX as INDEX, checkpoint_shards
from sempar.native_path import utf8_path
from sempar.placement.placement import Placement, cross_group_slots
from sempar.safe_json import read_json_object

_PER_EXPERT = re.compile(r"^(?P<pre>.*\blayers\.(?P<layer>\d+)\.[^.]+\.experts)\.(?P<j>\d+)\.(?P<rest>.+)$")
_FUSED = re.compile(r"^.*\blayers\.(?P<layer>\d+)\.[^.]+\.experts\.(?P<name>[^.]+)$")
_ROUTER = re.compile(r"^.*\blayers\.(?P<layer>\d+)\.[^.]+\."
                     r"(?:gate\.(?:weight|e_score_correction_bias)|router\.(?:weight|bias))$")


def groups_crossed(placement: Placement, num_groups: int) -> list[int]:
    """Model layer ids where the permutation moves an expert into another group
    (`cross_group_slots`)."""
    ids = list(placement.info.get("layer_ids", range(placement.num_layers)))
    return [int(ids[l]) for l in np.flatnonzero(cross_group_slots(placement, num_groups).any(1))]


def _limiting_groups(model_dir: Path) -> int:
    """The checkpoint's expert-group count when routing is group-limited, else 1."""
    cfg_file = model_dir / "config.json"
    cfg = read_json_object(cfg_file, "model config.json") if cfg_file.is_file() else {}
    values = {}
    for key in ("n_group", "topk_group"):
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or
                              not 1 <= v <= EXPERTS_MAX):
            raise InputError(f"{cfg_file}: {key}: {v!r} is not a positive integer")
        values[key] = v
    groups = values["n_group"] or 1
    return groups if (values["topk_group"] or groups) < groups else 1


def _load_shard(path: Path) -> dict:
    """{name: tensor} of one safetensors shard; a corrupt or truncated one is InputError."""
    from safetensors.torch import load_file

    try:
        with utf8_path(path) as name:      # safetensors takes UTF-8 names only
            return load_file(name)
    except Exception as err:     # SafetensorError (no OSError subclass), a header not JSON
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"{path}: not a readable safetensors file ({reason[:200]})") from None


def _save_shard(tensors: dict, path: Path) -> None:
    """Write one shard; a full disk or another write error is OSError (one line, exit 2),
    and the caller's temporary folder is removed."""
    from safetensors.torch import save_file

    try:
        save_file(tensors, path, metadata={"format": "pt"})
    except OSError:
        raise
    except Exception as err:     # safetensors reports I/O errors as SafetensorError
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise OSError(f"{path.name}: cannot be written ({reason[:200]})") from None


def _permute(key: str, t, perm: dict[int, np.ndarray], N: int, found: dict[str, set]):
    """(new key, new tensor) of one checkpoint tensor under the layers' permutations."""
    if m := _PER_EXPERT.match(key):
        layer = int(m["layer"])
        if layer in perm:
            found["experts"].add(layer)
            inv = np.argsort(perm[layer])  # new expert j holds old expert perm[j]: old -> new
            return f"{m['pre']}.{inv[int(m['j'])]}.{m['rest']}", t
        return key, t
    m = _ROUTER.match(key) or _FUSED.match(key)
    if m is None or int(m["layer"]) not in perm:
        return key, t
    layer = int(m["layer"])
    if t.shape[0] != N:
        raise InputError(f"{key}: shape {tuple(t.shape)} has no leading dimension of {N} experts "
                         "to permute")
    found["router" if m.re is _ROUTER else "experts"].add(layer)
    return key, t[perm[layer]].contiguous()


def permute_checkpoint(model_dir: str | os.PathLike, placement: Placement,
                       out_dir: str | os.PathLike) -> Path:
    """Write `model_dir` with experts permuted by `placement` to `out_dir` (atomically)."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if placement.redundant:
        raise InputError(f"--to hf-checkpoint: the placement has {placement.redundant} replica "
                         "slots per layer; a checkpoint holds each expert once (export it for an "
                         "engine instead)")
    groups = _limiting_groups(model_dir)
    crossed = groups_crossed(placement, groups)
    if crossed:
        raise InputError(f"--to hf-checkpoint: the placement moves experts across the model's "
                         f"{groups} expert groups in {len(crossed)} layers (first: layer "
                         f"{crossed[0]}), which changes its routing; solve with --preserve-groups")
    files, _ = checkpoint_shards(model_dir)
    perm = {int(m): placement.phy2log[l].astype(np.int64)
            for l, m in enumerate(placement.info.get("layer_ids", range(placement.num_layers)))}
    N = placement.num_experts
    found: dict[str, set] = {"experts": set(), "router": set()}
    weight_map: dict[str, str] = {}
    with atomic_folder(out_dir, "hf-checkpoint", model_dir) as work:
        work.rmdir()          # copytree makes it again
        shutil.copytree(model_dir, work, ignore=shutil.ignore_patterns("*.safetensors", MARKER))
        for f in files:
            # each tensor keeps its shard; per-expert tensors change name (possibly to a name
            # another shard held before), which the rewritten index records
            new = dict(_permute(key, t, perm, N, found) for key, t in _load_shard(f).items())
            _save_shard(new, work / f.name)
            weight_map.update((key, f.name) for key in new)
        missing = sorted(set(perm) - found["experts"])
        if missing:
            raise InputError(f"{model_dir}: found no expert tensors for MoE layer {missing[0]} "
                             "of the placement")
        no_router = sorted(set(perm) - found["router"])
        if no_router:
            raise InputError(f"{model_dir}: found no router (gate/router weight with {N} rows) "
                             f"for MoE layer {no_router[0]}; permuting its experts alone would "
                             "change the model")
        if (model_dir / INDEX).is_file():
            index = read_json_object(model_dir / INDEX, "safetensors index")
            index["weight_map"] = dict(sorted(weight_map.items()))
            (work / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return out_dir
