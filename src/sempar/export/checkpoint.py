"""A permuted HF checkpoint: Sem-MoE's transparent expert shuffle (Sem-MoE Appendix B).

For every MoE layer the experts are renumbered so that the experts the placement puts on device
g become the contiguous block g (new expert j = old expert `phy2log[l, j]`), and the router's
rows (and any per-expert bias such as DeepSeek-V3's `e_score_correction_bias`) are permuted the
same way. An engine's default contiguous EP split then realises the placement with no engine
change, and the model computes the same function: the router picks the same experts under new
names. Replicas cannot be written this way (a checkpoint holds each expert once): refused.

Tensors are matched by name in the safetensors files: `...layers.<i>.<block>.experts.<j>.<rest>`
(one tensor per expert), fused `...layers.<i>.<block>.experts.<name>` with N rows, and
`...layers.<i>.<block>.gate.weight` / `.e_score_correction_bias` with N rows.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np

from sempar.atomic import MARKER, atomic_folder
from sempar.errors import InputError
from sempar.placement.placement import Placement

_PER_EXPERT = re.compile(r"^(?P<pre>.*\blayers\.(?P<layer>\d+)\.[^.]+\.experts)\.(?P<j>\d+)\.(?P<rest>.+)$")
_FUSED = re.compile(r"^.*\blayers\.(?P<layer>\d+)\.[^.]+\.experts\.(?P<name>[^.]+)$")
_ROUTER = re.compile(r"^.*\blayers\.(?P<layer>\d+)\.[^.]+\.gate\.(?:weight|e_score_correction_bias)$")


def permute_checkpoint(model_dir: str | os.PathLike, placement: Placement,
                       out_dir: str | os.PathLike) -> Path:
    """Write `model_dir` with experts permuted by `placement` to `out_dir` (atomically)."""
    from safetensors.torch import load_file, save_file

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if placement.redundant:
        raise InputError(f"--to hf-checkpoint: the placement has {placement.redundant} replica "
                         "slots per layer; a checkpoint holds each expert once (export it for an "
                         "engine instead)")
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InputError(f"{model_dir}: no .safetensors files")
    perm = {int(m): placement.phy2log[l].astype(np.int64)
            for l, m in enumerate(placement.info.get("layer_ids", range(placement.num_layers)))}
    N = placement.num_experts
    touched = set()
    with atomic_folder(out_dir, "hf-checkpoint", model_dir) as work:
        work.rmdir()          # copytree makes it again
        shutil.copytree(model_dir, work, ignore=shutil.ignore_patterns("*.safetensors", MARKER))
        for f in files:
            tensors = load_file(f)
            new = dict(tensors)
            for key, t in tensors.items():
                if m := _PER_EXPERT.match(key):
                    layer = int(m["layer"])
                    if layer in perm:
                        # new expert j holds old expert perm[j]: the inverse maps old -> new
                        inv = np.argsort(perm[layer])
                        new_key = f"{m['pre']}.{inv[int(m['j'])]}.{m['rest']}"
                        new[new_key] = t
                        touched.add(layer)
                elif (m := _ROUTER.match(key) or _FUSED.match(key)) and int(m["layer"]) in perm \
                        and t.shape[0] == N:
                    new[key] = t[perm[int(m["layer"])]].contiguous()
                    touched.add(int(m["layer"]))
            save_file(new, work / f.name, metadata={"format": "pt"})
        missing = sorted(set(perm) - touched)
        if missing:
            raise InputError(f"{model_dir}: found no expert tensors for MoE layer {missing[0]} "
                             "of the placement")
    return out_dir
