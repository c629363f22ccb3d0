"""Hostile file CONTENT (issue 27, kinds 1, 4, 5, 6, 13b): every file a verb reads may be nested,
mistyped, out of range, edited after it was written or pointing outside its folder, and each is
one line `error: ...` with exit 2 and nothing written, or a correct exit 0; never a traceback,
never output that silently means something else. Property-style where a kind has a space of
cases (any JSON nesting depth, any metadata field replaced by a wrong type or an out-of-range
value); tiny inputs, in-process through `sempar.cli.main`.

The first-pass cases (flipped bits, truncated and foreign files, FIFOs) are in test_bad_input.py,
bad_traces.py and test_trace_integrity.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import build_trace, rewrite
from sempar.bounds import JSON_DEPTH_MAX, LAYERS_MAX
from sempar.cli import main
from sempar.trace import write_trace
from sempar.trace.io import META_KEY, SUM_KEY

FAST = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def run(args: list[Any], cwd: Path) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `sempar ARGS` run in-process in `cwd`."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
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


def nested(depth: int, kind: str) -> Any:
    v: Any = 0
    for _ in range(depth):
        v = [v] if kind == "list" else {"k": v}
    return v


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
def d(tmp_path_factory) -> Path:
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


# ------------------------------------------------------------- kind 1: nesting and wrong types

@FAST
@given(depth=st.integers(1, 5000), kind=st.sampled_from(["list", "dict"]),
       where=st.sampled_from(["placement", "topology", "trace", "placement-info"]))
def test_any_json_nesting_is_one_line_or_read(d, tmp_path_factory, depth, kind, where):
    """Deep nesting in any user JSON: read when shallow enough (then refused or used on its
    merits), refused in one line before parsing when deeper than JSON_DEPTH_MAX."""
    cwd = tmp_path_factory.mktemp("run")
    text = deep_text(depth, kind)
    if where == "placement":
        f = cwd / "p.json"
        f.write_text(text)
        args = ["export", "--placement", f, "--to", "sglang", "--out", "o.json"]
    elif where == "placement-info":
        f = cwd / "p.json"
        f.write_text(json.dumps(PLACEMENT)[:-1] + ', "extra": ' + text + "}")
        args = ["export", "--placement", f, "--to", "sglang", "--out", "o.json"]
    elif where == "topology":
        f = cwd / "t.json"
        f.write_text(json.dumps(TOPOLOGY)[:-1] + ', "collectives": ' + text + "}")
        args = ["simulate", "--trace", d / "good.parquet", "--hidden", "64", "--topology", f]
    else:
        block = json.loads(pq.ParquetFile(d / "good.parquet").metadata.metadata[META_KEY])
        raw = json.dumps(block)[:-1] + ', "extra": ' + text + "}"
        f = rewrite(d / "good.parquet", cwd / "t.parquet", raw_block=raw.encode())
        args = ["trace", "validate", f]
    code, _, err = run(args, cwd)
    assert "Traceback" not in err and code in (0, 2), err[-2000:]
    if code == 2:
        assert len(err.strip().splitlines()) == 1
    if depth + 1 > JSON_DEPTH_MAX:
        assert code == 2 and "nested" in err, err


def test_nesting_is_checked_before_parsing():
    from sempar.errors import InputError
    from sempar.safe_json import nesting_depth, parse_json

    assert nesting_depth(b'[["]]]]\\"[[[", {"a": [1]}]]') == 4
    assert nesting_depth(b'"\\\\"[[') == 2         # an escaped backslash ends the string
    with pytest.raises(InputError, match="nested 100000 levels"):
        parse_json("[" * 100_000, "x")              # unbalanced: refused before the parser
    with pytest.raises(InputError, match="NaN is not a JSON number"):
        parse_json("[NaN]", "x", allow_nan=False)
    with pytest.raises(InputError, match="above the limit 10"):
        parse_json("[" + "0," * 10 + "0]", "x", max_bytes=10)


def test_placement_layer_ids_beyond_the_model(d, tmp_path):
    f = placement_file(d, "beyond.json", info={"layer_ids": [1, 2, 7]})
    refused(["export", "--placement", f, "--to", "sglang", "--out", "o.json"], tmp_path,
            "placement.info.layer_ids", tmp_path / "o.json")


TOPOLOGY_WRONG_TYPES = [
    {"name": ["a"]}, {"name": {"x": 1}}, {"links": {"a": 1}}, {"links": [[0, 1, 1e-6, 1e-9]]},
    {"links": [{**LINK, "alpha": "fast"}]}, {"links": [{**LINK, "beta": None}]},
    {"links": [{**LINK, "alpha": [1e-6, "x", 1e-6]}]}, {"links": [{**LINK, "src": [0]}]},
    {"links": [{**LINK, "dst": True}]}, {"links": [{**LINK, "alpha": {"dispatch": 1e-6}}]},
    {"aggregation": ["cut-through"]}, {"symmetric": "yes"}, {"paths": "none"},
    {"paths": [{"src": 0, "dst": 1, "via": 5}]}, {"paths": [{"src": 0, "dst": 1, "via": [0, "zz", 1]}]},
    {"collectives": ["gloo"]}, {"node_of": {"0": 0}}, {"node_of": [0, 0.5]},
]


@pytest.mark.parametrize("edit", TOPOLOGY_WRONG_TYPES, ids=[str(e)[:40] for e in TOPOLOGY_WRONG_TYPES])
def test_topology_fields_of_the_wrong_type(d, tmp_path, edit):
    f = tmp_path / "t.json"
    f.write_text(json.dumps({**TOPOLOGY, **edit}))
    refused(["simulate", "--trace", d / "good.parquet", "--hidden", "64", "--topology", f],
            tmp_path, "topology")


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


def test_sglang_dump_reads_and_refuses_what_does_not_fit(tmp_path):
    torch = pytest.importorskip("torch")
    good = _dump(tmp_path / "ok_0.pt")
    assert run(["import", "sglang", good, "--out", "ok.parquet"], tmp_path)[0] == 0
    cases = {"forward_mode": (torch.tensor([2, 2]), "forward_mode: Tensor is not an integer"),
             "forward_pass_id": ([0], "forward_pass_id: list is not an integer"),
             "positions": ([0, 1, 2, 2**32 + 5], "value 4294967301 does not fit int32"),
             "input_ids": ([5, 6, 2**31, 8], "value 2147483648 does not fit int32")}
    for key, (value, message) in cases.items():
        f = _dump(tmp_path / f"bad_{key}_0.pt", **{key: value})
        refused(["import", "sglang", f, "--out", "o.parquet"], tmp_path, message, tmp_path / "o.parquet")


# ------------------------------------------------------------ hf-checkpoint: corrupt / full / out

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


def test_hf_checkpoint_permutes_a_good_folder(tmp_path):
    model, p = _checkpoint(tmp_path / "m"), _perm_placement(tmp_path)
    code, _, err = run(["export", "--placement", p, "--to", "hf-checkpoint", "--model", model,
                        "--out", "out"], tmp_path)
    assert code == 0, err
    assert sorted(f.name for f in (tmp_path / "out").glob("*.safetensors")) == ["a.safetensors",
                                                                               "b.safetensors"]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "header"])
def test_hf_checkpoint_of_a_corrupt_folder(tmp_path, damage):
    model, p = _checkpoint(tmp_path / "m"), _perm_placement(tmp_path)
    shard = model / "b.safetensors"
    raw = shard.read_bytes()
    shard.write_bytes({"truncated": raw[: len(raw) // 2], "garbage": b"\xff" * 64,
                       "header": (10**6).to_bytes(8, "little") + b"{}"}[damage])
    refused(["export", "--placement", p, "--to", "hf-checkpoint", "--model", model, "--out", "out"],
            tmp_path, "not a readable safetensors file", tmp_path / "out")


def test_hf_checkpoint_onto_a_full_disk(tmp_path, monkeypatch):
    """safetensors reports ENOSPC as SafetensorError; the half-written shard goes with the
    temporary folder and the error is one line."""
    import safetensors.torch as st_torch
    from safetensors import SafetensorError

    model, p = _checkpoint(tmp_path / "m"), _perm_placement(tmp_path)
    calls = []

    def full(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:                  # the second shard hits the full disk
            Path(filename).write_bytes(b"\0" * 100)
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                                  "StorageFull, message: \"No space left on device\" })")
        return real(tensors, filename, metadata=metadata)

    real = st_torch.save_file
    monkeypatch.setattr(st_torch, "save_file", full)
    line = refused(["export", "--placement", p, "--to", "hf-checkpoint", "--model", model,
                    "--out", "out"], tmp_path, "cannot be written", tmp_path / "out")
    assert "No space left" in line
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m", "perm.json"]


# ---------------------------------------------------- kind 13b: shard paths outside the folder

@pytest.mark.parametrize("shard", ["../../x.safetensors", "/etc/passwd", "sub/../../x.safetensors",
                                   "link.safetensors"])
def test_index_shards_outside_the_model_folder_are_refused(tmp_path, shard, monkeypatch):
    model, p = _checkpoint(tmp_path / "m"), _perm_placement(tmp_path)
    outside = tmp_path / "x.safetensors"
    outside.write_bytes((model / "a.safetensors").read_bytes())
    (model / "link.safetensors").symlink_to(outside)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: (shard if v == "b.safetensors" else v)
                           for k, v in index["weight_map"].items()}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    opened = []
    import safetensors.torch as st_torch
    real = st_torch.load_file
    monkeypatch.setattr(st_torch, "load_file", lambda f, *a, **k: opened.append(str(f)) or real(f, *a, **k))
    refused(["export", "--placement", p, "--to", "hf-checkpoint", "--model", model, "--out", "out"],
            tmp_path, "lies outside the model folder", tmp_path / "out")
    assert opened == []


def test_a_symlinked_shard_leading_out_without_an_index(tmp_path):
    from sempar.errors import InputError
    from sempar.models import checkpoint_shards

    model = _checkpoint(tmp_path / "m")
    (model / "model.safetensors.index.json").unlink()
    (tmp_path / "x.safetensors").write_bytes(b"")
    (model / "c.safetensors").symlink_to(tmp_path / "x.safetensors")
    with pytest.raises(InputError, match="'c.safetensors' lies outside the model folder"):
        checkpoint_shards(model)
    (model / "c.safetensors").unlink()
    assert [f.name for f in checkpoint_shards(model)[0]] == ["a.safetensors", "b.safetensors"]


def test_packaged_model_names_from_a_trace_stay_in_the_package():
    from sempar.paths import packaged_model_dir

    assert packaged_model_dir("tiny-moe64") is not None
    for name in ("../models/tiny-moe64", "..", "/tmp", "tiny-moe64/../tiny-moe64", 5, ["x"]):
        assert packaged_model_dir(name) is None


# ------------------------------------------- kinds 4 and 5: metadata typed, bounded, checksummed

TRACE_META_BAD = {
    # field: values that must be refused (wrong type or out of range)
    "model": [None, ["m"], 5, {"a": 1}, ""],
    "num_layers": ["3", 3.0, None, True, -3, 0, 10**9],
    "num_experts": ["8", 8.5, [8], 0, 2**31, -8],
    "top_k": [2.0, "2", 0, 99],
    "vocab_size": [1000.0, "1000", 0, 2**40],
    "shared_experts": [-1, 0.5, "0", 10**6],
    "num_expert_groups": [3, 0, 1.0, "1", [1]],
    "topk_groups": [0, 2, "1"],
    "layer_ids": [[0, 1], [0, 0, 1], [-1, 0, 1], [2, 1, 0], [0, 1, 1.5], "012", {"0": 0},
                  [0, 1, LAYERS_MAX], 5],
    "num_hidden_layers": [10**9, 2 * 10**6, LAYERS_MAX + 1, 2, 3.0, "3", [3], True],
    "model_type": [["qwen3_moe"], 5, {"a": "b"}, "", "x\x1b[31m", "x" * 200],
    "has_token_ids": ["yes", 1, None, [True]],
    "extra": [[1, 2], "x", 5],
}


@pytest.mark.parametrize("field,value", [(f, v) for f, vs in TRACE_META_BAD.items() for v in vs],
                         ids=[f"{f}={str(v)[:20]}" for f, vs in TRACE_META_BAD.items() for v in vs])
def test_trace_metadata_field_wrong_type_or_range(d, tmp_path, field, value):
    """Any trace metadata field replaced by a wrong type or an out-of-range value (the block
    resealed, as a tool that rewrites the footer would) is one line naming the field."""
    f = rewrite(d / "good.parquet", tmp_path / "t.parquet",
                block_edit=lambda b: b["meta"].update({field: value}))
    line = refused(["trace", "validate", f], tmp_path)
    assert "metadata" in line


@FAST
@given(field=st.sampled_from(sorted(TRACE_META_BAD)),
       value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                          | st.text(max_size=8), lambda c: st.lists(c, max_size=3)
                          | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=6))
def test_any_trace_metadata_value_is_read_or_one_line(d, tmp_path_factory, field, value):
    cwd = tmp_path_factory.mktemp("meta")
    f = rewrite(d / "good.parquet", cwd / "t.parquet",
                block_edit=lambda b: b["meta"].update({field: value}))
    code, _, err = run(["trace", "info", "--json", f], cwd)
    assert "Traceback" not in err and code in (0, 2), err[-2000:]
    if code == 2:
        assert len(err.strip().splitlines()) == 1
    else:       # accepted: only a value of the field's own type
        assert ACCEPTABLE[field](value), (field, value)


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(type(i) is int for i in v)


ACCEPTABLE = {
    "model": lambda v: isinstance(v, str), "model_type": lambda v: v is None or isinstance(v, str),
    "has_token_ids": lambda v: isinstance(v, bool), "extra": lambda v: isinstance(v, dict),
    "layer_ids": lambda v: v is None or _ints(v),
    "num_hidden_layers": lambda v: v is None or type(v) is int,
    **{f: lambda v: type(v) is int for f in ("num_layers", "num_experts", "top_k", "vocab_size",
                                              "shared_experts", "num_expert_groups", "topk_groups")},
}


def test_metadata_block_edited_after_writing_is_refused(d, tmp_path):
    """64 -> 74 experts in the footer: ids below 74 still validate, so only the checksum can
    tell. Refused with the stale checksum, refused without one in a format-3 file; a format-2
    file (written before the checksum) without one still reads."""
    t = build_trace(T=200, R=20, L=3, N=64, k=2)
    write_trace(t, tmp_path / "t64.parquet")
    edit = lambda b: b["meta"].update(num_experts=74)           # noqa: E731
    stale = rewrite(tmp_path / "t64.parquet", tmp_path / "stale.parquet", block_edit=edit, seal=False)
    kv = pq.ParquetFile(stale).metadata.metadata
    assert SUM_KEY not in kv
    refused(["trace", "validate", stale], tmp_path, "has none (edited by hand?)")
    forged = tmp_path / "forged.parquet"
    table = pq.read_table(tmp_path / "t64.parquet")
    block = json.loads(pq.ParquetFile(tmp_path / "t64.parquet").metadata.metadata[META_KEY])
    edit(block)
    sums = pq.ParquetFile(tmp_path / "t64.parquet").metadata.metadata[SUM_KEY]
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(block), SUM_KEY: sums}), forged)
    for verb in (["trace", "validate"], ["trace", "info"]):
        refused([*verb, forged], tmp_path, "does not match its checksum")
    refused(["place", "--trace", forged, "--method", "vanilla", "--ep", "4", "--out", "p.json"],
            tmp_path, "does not match its checksum", tmp_path / "p.json")
    old = rewrite(tmp_path / "t64.parquet", tmp_path / "v2.parquet", seal=False,
                  block_edit=lambda b: b.update(format_version=2))
    assert run(["trace", "validate", old], tmp_path)[0] == 0


PLACEMENT_BAD = {
    "num_devices": ["4", 4.0, 0, 10**6, None],
    "num_experts": ["8", 9, 0, 2**40],
    "method": [["x"], 5],
    "node_of": [0, [0, 0, 0], [0, 0, 0, "a"], [0, 0, 0, 2**40]],
    "phy2log": [[0] * 8, [[0] * 8] * 3, [list(range(8))] * 2 + [list(range(7)) + [9]],
                [list(range(8))] * 2 + [list(range(7)) + [7.5]], [list(range(8))] * 2 + [[-1] + list(range(1, 8))]],
    "info": [[1], "x"],
    "info.layer_ids": [[-1, 1, 2], [1, 2], [1, 1, 2], [3, 2, 1], [1, 2, 4], "123", [1, 2, 3.0]],
    "info.num_hidden_layers": [10**9, 2 * 10**6, LAYERS_MAX + 1, 3, "4", 4.5],
    "info.model_type": [["deepseek_v3"], 5, ""],
    "info.num_expert_groups": [3, 0, "1"],
    "info.model": [["m"], 5],
    "info.token_table": [{"token_id": [1, 2], "device": [[0, 70000]] * 3, "confidence": [[1, 1]] * 3},
                         {"token_id": [1, 2], "device": [[0, 9]] * 3, "confidence": [[1, 1]] * 3},
                         {"token_id": [1, 2], "device": [[0, 1]] * 2, "confidence": [[1, 1]] * 2},
                         {"token_id": [1.5, 2], "device": [[0, 1]] * 3, "confidence": [[1, 1]] * 3}],
}


@pytest.mark.parametrize("field,value", [(f, v) for f, vs in PLACEMENT_BAD.items() for v in vs],
                         ids=[f"{f}={str(v)[:24]}" for f, vs in PLACEMENT_BAD.items() for v in vs])
def test_placement_field_wrong_type_or_range(d, tmp_path, field, value):
    """Every placement field, `info`'s layout fields included, is checked on read: no engine
    file with MoE rows on the wrong layers, no 496 MB file from num_hidden_layers 2e6."""
    p = json.loads(json.dumps(PLACEMENT))
    if field.startswith("info."):
        p["info"][field[5:]] = value
    else:
        p[field] = value
    f = tmp_path / "p.json"
    f.write_text(json.dumps(p))
    for to in ("sglang", "vllm"):
        line = refused(["export", "--placement", f, "--to", to, "--out", "o.json"], tmp_path,
                       None, tmp_path / "o.json")
        assert any(w in line for w in (field.split(".")[-1], "placement", "phy2log")), line


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40)
                           | st.floats(allow_nan=False) | st.text(max_size=6),
                           lambda c: st.lists(c, max_size=4)
                           | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=8)


@FAST
@given(field=st.sampled_from(["num_devices", "num_experts", "node_of", "method", "info.layer_ids",
                              "info.num_hidden_layers", "info.model_type",
                              "info.num_expert_groups", "info.model"]),
       value=JSON_VALUES | st.lists(st.integers(-2, 12), max_size=5))
def test_any_placement_value_is_refused_or_exported_right(tmp_path_factory, field, value):
    """Any value in any placement field: one line exit 2, or an SGLang file whose MoE rows sit
    exactly at the placement's layer_ids of its num_hidden_layers rows (never wrong rows)."""
    cwd = tmp_path_factory.mktemp("pv")
    p = json.loads(json.dumps(PLACEMENT))
    p["phy2log"] = [np.roll(np.arange(8), s).tolist() for s in (1, 2, 3)]
    if field.startswith("info."):
        p["info"][field[5:]] = value
    else:
        p[field] = value
    (cwd / "p.json").write_text(json.dumps(p))
    code, _, err = run(["export", "--placement", "p.json", "--to", "sglang", "--out", "o.json"], cwd)
    assert "Traceback" not in err and code in (0, 2), err[-2000:]
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and not (cwd / "o.json").exists()
        return
    rows = json.loads((cwd / "o.json").read_text())["physical_to_logical_map"]
    ids, n = p["info"]["layer_ids"], p["info"]["num_hidden_layers"]
    assert len(rows) == n and [rows[i] for i in ids] == p["phy2log"]


def test_placement_layout_puts_rows_on_their_layers(d, tmp_path):
    """The good placement's MoE rows land on layers 1..3 of 4, the dense row 0 contiguous."""
    p = json.loads(json.dumps(PLACEMENT))
    p["phy2log"] = [np.roll(np.arange(8), s).tolist() for s in (1, 2, 3)]
    (tmp_path / "p.json").write_text(json.dumps(p))
    assert run(["export", "--placement", "p.json", "--to", "sglang", "--out", "o.json"], tmp_path)[0] == 0
    rows = json.loads((tmp_path / "o.json").read_text())["physical_to_logical_map"]
    assert rows == [list(range(8))] + p["phy2log"]


# ---------------------------------------------------------- kind 6: cheap links are links

@pytest.mark.parametrize("alpha,beta", [(5e-9, 0.0), (0.0, 0.0), (0.0, 1e-18), (1e-12, 0.0)])
def test_cheap_links_are_routes_not_missing_links(d, tmp_path, alpha, beta):
    from sempar.comm.topology import Topology

    topo = {"name": "cheap", "node_of": [0, 0, 0, 0], "symmetric": True, "links":
            [{"src": g, "dst": "sw", "alpha": alpha, "beta": beta} for g in range(4)]}
    f = tmp_path / "t.json"
    f.write_text(json.dumps(topo))
    t = Topology.load(f)
    off = ~np.eye(4, dtype=bool)
    assert np.allclose(t.alpha[:, off], 2 * alpha) and np.allclose(t.beta[:, off], 2 * beta)
    code, _, err = run(["simulate", "--trace", d / "good.parquet", "--hidden", "64",
                        "--topology", f], tmp_path)
    assert code == 0, err
    gap = {**topo, "links": topo["links"][:3]}                 # device 3 unreachable
    f.write_text(json.dumps(gap))
    refused(["simulate", "--trace", d / "good.parquet", "--hidden", "64", "--topology", f],
            tmp_path, "no route")


# ----------------------------------------- evaluate --online on a trace not from the named model

def test_online_on_token_ids_beyond_the_named_models_vocabulary(tmp_path):
    from sempar.paths import packaged_model_dir

    if packaged_model_dir("tiny-moe64") is None:
        pytest.skip("tiny-moe64 not packaged")
    write_trace(build_trace(T=400, R=20, L=3, N=16, k=2, vocab=1_000_000, model="tiny-moe64"),
                tmp_path / "t.parquet")
    refused(["evaluate", "--fit", "t.parquet", "--split", "--ep", "4", "--online", "--methods",
             "vanilla"], tmp_path, "vocabulary has 8192 tokens")
