"""Helpers of the hostile-content suite (test_hostile_content.py, test_hostile_metadata.py):
the CLI run in-process, the one-line-refusal check, and tiny good files to spoil. Loaded as a
pytest plugin by conftest.py for the `hostile_files` fixture."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from conftest import build_trace
from sempar.trace import write_trace

FAST = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def run(args: list[Any], cwd: Path | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `sempar ARGS` run in-process (in `cwd` when given)."""
    from sempar.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd or old)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def refused(args: list[Any], cwd: Path, expected: str | None = None, out: Path | None = None) -> str:
    """Assert `sempar ARGS` is one error line with exit 2 (matching `expected`) and, when `out`
    is given, that nothing was written there; the line."""
    code, _, err = run(args, cwd)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err[-3000:])
    if expected is not None:
        assert expected in lines[0], lines[0]
    if out is not None:
        assert not out.exists(), f"{out} written by a refused run"
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    return lines[0]


def deep_text(depth: int, kind: str) -> str:
    """JSON text nested `depth` levels (built as text: json.dumps itself recurses)."""
    o, c = ("[", "]") if kind == "list" else ('{"k":', "}")
    return o * depth + "0" + c * depth


# ------------------------------------------------------------------------------------ files

PLACEMENT = {"format_version": 1, "method": "x", "num_experts": 8, "num_devices": 4,
             "node_of": [0, 0, 0, 0], "phy2log": [list(range(8))] * 3,
             "info": {"layer_ids": [1, 2, 3], "num_hidden_layers": 4, "model_type": "qwen3_moe",
                      "num_expert_groups": 1, "model": "toy-moe"}}
LINK = {"src": 0, "dst": 1, "alpha": 1e-6, "beta": 1e-9}
TOPOLOGY = {"name": "t", "node_of": [0, 0], "links": [LINK, {**LINK, "src": 1, "dst": 0}]}


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory) -> Path:
    """A folder with good.parquet (200 tokens, 3 layers x 8 experts, top-2) and p.json."""
    root = tmp_path_factory.mktemp("hostile")
    write_trace(build_trace(T=200, R=20, L=3, N=8, k=2), root / "good.parquet")
    (root / "p.json").write_text(json.dumps(PLACEMENT))
    return root


def placement_file(d: Path, name: str, **edit: Any) -> Path:
    p = json.loads(json.dumps(PLACEMENT))
    info = edit.pop("info", None)
    p.update(edit)
    if info is not None:
        p["info"].update(info)
    f = d / name
    f.write_text(json.dumps(p))
    return f


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40)
                           | st.floats(allow_nan=False) | st.text(max_size=6),
                           lambda c: st.lists(c, max_size=4)
                           | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=8)


def _dump(path: Path, **record_edit: Any) -> Path:
    torch = pytest.importorskip("torch")
    T, L, P = 4, 3, 8
    rec = {"forward_pass_id": 0, "rank": 0, "gatherer_key": "primary",
           "input_ids": [5, 6, 7, 8], "positions": [0, 1, 2, 3], "extend_seq_lens": None,
           "forward_mode": 1,
           "topk_ids_of_layer": torch.tensor([[[0, 1]] * T] * L, dtype=torch.int32),
           "misc_objects": [], "global_physical_count": torch.zeros(L, P, dtype=torch.int64)}
    rec.update(record_edit)
    torch.save({"records": [rec], "last_physical_to_logical_map": torch.arange(P).repeat(L, 1)},
               path)
    return path


def _checkpoint(folder: Path, N: int = 8) -> Path:
    """A minimal sharded MoE checkpoint (2 layers, N experts) permute_checkpoint accepts."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": N}))
    shards: dict[str, dict] = {"a.safetensors": {}, "b.safetensors": {}}
    for layer, shard in ((0, "a.safetensors"), (1, "b.safetensors")):
        shards[shard][f"model.layers.{layer}.mlp.gate.weight"] = torch.randn(N, 4)
        for j in range(N):
            shards[shard][f"model.layers.{layer}.mlp.experts.{j}.up_proj.weight"] = torch.randn(2, 4)
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, folder / name)
        weight_map.update((k, name) for k in tensors)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def _perm_placement(tmp: Path, N: int = 8) -> Path:
    f = tmp / "perm.json"
    rng = np.random.default_rng(0)
    f.write_text(json.dumps({**PLACEMENT, "num_experts": N, "phy2log":
                             [rng.permutation(N).tolist() for _ in range(2)],
                             "info": {"layer_ids": [0, 1]}}))
    return f
