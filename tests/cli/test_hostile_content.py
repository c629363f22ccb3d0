"""Hostile file CONTENT (issue 27, kinds 1, 4, 5, 6, 13b): every file a verb reads may be nested,
mistyped, out of range, edited after it was written or pointing outside its folder, and each is
one line `error: ...` with exit 2 and nothing written, or a correct exit 0; never a traceback,
never output that silently means something else. Property-style where a kind has a space of
cases (any JSON nesting depth, any metadata field replaced by a wrong type or an out-of-range
value); tiny inputs, in-process through `sempar.cli.main`.

The first-pass cases (flipped bits, truncated and foreign files, FIFOs) are in test_bad_input.py,
bad_traces.py and test_trace_integrity.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import build_trace, rewrite
from hostile import (FAST, JSON_VALUES, LINK, PLACEMENT, TOPOLOGY, _checkpoint, _dump, _perm_placement,
                     deep_text, placement_file, refused, run)
from sempar.bounds import JSON_DEPTH_MAX
from sempar.trace import write_trace
from sempar.trace.io import META_KEY


# ------------------------------------------------------------- kind 1: nesting and wrong types

@FAST
@given(depth=st.integers(1, 5000), kind=st.sampled_from(["list", "dict"]),
       where=st.sampled_from(["placement", "topology", "trace", "placement-info"]))
def test_any_json_nesting_is_one_line_or_read(hostile_files, tmp_path_factory, depth, kind, where):
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
        args = ["simulate", "--trace", hostile_files / "good.parquet", "--hidden", "64", "--topology", f]
    else:
        block = json.loads(pq.ParquetFile(hostile_files / "good.parquet").metadata.metadata[META_KEY])
        raw = json.dumps(block)[:-1] + ', "extra": ' + text + "}"
        f = rewrite(hostile_files / "good.parquet", cwd / "t.parquet", raw_block=raw.encode())
        args = ["trace", "validate", f]
    code, _, err = run(args, cwd)
    assert "Traceback" not in err and code in (0, 2), err[-2000:]
    if code == 2:
        assert len(err.strip().splitlines()) == 1
    # the placement case is the whole file (`depth` levels); the others sit one level inside
    # an object
    if depth + (where != "placement") > JSON_DEPTH_MAX:
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


def test_placement_layer_ids_beyond_the_model(hostile_files, tmp_path):
    f = placement_file(hostile_files, "beyond.json", info={"layer_ids": [1, 2, 7]})
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
def test_topology_fields_of_the_wrong_type(hostile_files, tmp_path, edit):
    f = tmp_path / "t.json"
    f.write_text(json.dumps({**TOPOLOGY, **edit}))
    refused(["simulate", "--trace", hostile_files / "good.parquet", "--hidden", "64", "--topology", f],
            tmp_path, "topology")


@FAST
@given(field=st.sampled_from(["name", "node_of", "links", "paths", "aggregation", "symmetric",
                              "collectives", "links.src", "links.dst", "links.alpha",
                              "links.beta"]), value=JSON_VALUES)
def test_any_topology_value_is_read_or_one_line(hostile_files, tmp_path_factory, field, value):
    cwd = tmp_path_factory.mktemp("topo")
    t = json.loads(json.dumps(TOPOLOGY))
    if field.startswith("links."):
        t["links"][0][field[6:]] = value
    else:
        t[field] = value
    (cwd / "t.json").write_text(json.dumps(t))
    code, _, err = run(["simulate", "--trace", hostile_files / "good.parquet", "--hidden", "64",
                        "--topology", "t.json"], cwd)
    assert "Traceback" not in err and code in (0, 2), err[-2000:]
    assert code == 0 or len(err.strip().splitlines()) == 1


@FAST
@given(field=st.sampled_from(["input_ids", "positions", "extend_seq_lens", "forward_mode",
                              "forward_pass_id", "rank", "topk_ids_of_layer"]),
       value=JSON_VALUES | st.lists(st.integers(-2**40, 2**40), min_size=4, max_size=4))
def test_any_sglang_record_value_is_imported_or_one_line(tmp_path_factory, field, value):
    cwd = tmp_path_factory.mktemp("dump")
    f = _dump(cwd / "d_0.pt", **{field: value})
    code, _, err = run(["import", "sglang", f, "--out", "o.parquet"], cwd)
    assert "Traceback" not in err and code in (0, 2), err[-2000:]
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and not (cwd / "o.parquet").exists()
    else:           # what was imported is what the dump says, not a wrapped value
        from sempar.trace import read_trace
        t = read_trace(cwd / "o.parquet")
        if field in ("input_ids", "positions") and isinstance(value, list):
            got = t.token_id if field == "input_ids" else t.position
            assert got.tolist() == value


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


# ---------------------------------------------------------- kind 6: cheap links are links

@pytest.mark.parametrize("alpha,beta", [(5e-9, 0.0), (0.0, 0.0), (0.0, 1e-18), (1e-12, 0.0)])
def test_cheap_links_are_routes_not_missing_links(hostile_files, tmp_path, alpha, beta):
    from sempar.comm.topology import Topology

    topo = {"name": "cheap", "node_of": [0, 0, 0, 0], "symmetric": True, "links":
            [{"src": g, "dst": "sw", "alpha": alpha, "beta": beta} for g in range(4)]}
    f = tmp_path / "t.json"
    f.write_text(json.dumps(topo))
    t = Topology.load(f)
    off = ~np.eye(4, dtype=bool)
    assert np.allclose(t.alpha[:, off], 2 * alpha) and np.allclose(t.beta[:, off], 2 * beta)
    code, _, err = run(["simulate", "--trace", hostile_files / "good.parquet", "--hidden", "64",
                        "--topology", f], tmp_path)
    assert code == 0, err
    gap = {**topo, "links": topo["links"][:3]}                 # device 3 unreachable
    f.write_text(json.dumps(gap))
    refused(["simulate", "--trace", hostile_files / "good.parquet", "--hidden", "64", "--topology", f],
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
