"""Hostile metadata (issue 27, kinds 4 and 5): every trace metadata field and placement field,
`info`'s layout fields included, typed and bounded like the flag that sets it, and a trace
footer edited after writing refused by its checksum. Any wrong type or out-of-range value is one
line and exit 2; an accepted value is one of the field's own type, and an exported engine file
puts the MoE rows exactly at the placement's layer_ids. Helpers: hostile.py."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import build_trace, rewrite
from hostile import FAST, JSON_VALUES, PLACEMENT, refused, run
from sempar.bounds import LAYERS_MAX
from sempar.trace import write_trace
from sempar.trace.io import META_KEY, SUM_KEY


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
def test_trace_metadata_field_wrong_type_or_range(hostile_files, tmp_path, field, value):
    """Any trace metadata field replaced by a wrong type or an out-of-range value (the block
    resealed, as a tool that rewrites the footer would) is one line naming the field."""
    f = rewrite(hostile_files / "good.parquet", tmp_path / "t.parquet",
                block_edit=lambda b: b["meta"].update({field: value}))
    line = refused(["trace", "validate", f], tmp_path)
    assert "metadata" in line


@FAST
@given(field=st.sampled_from(sorted(TRACE_META_BAD)),
       value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                          | st.text(max_size=8), lambda c: st.lists(c, max_size=3)
                          | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=6))
def test_any_trace_metadata_value_is_read_or_one_line(hostile_files, tmp_path_factory, field, value):
    cwd = tmp_path_factory.mktemp("meta")
    f = rewrite(hostile_files / "good.parquet", cwd / "t.parquet",
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


def test_metadata_block_edited_after_writing_is_refused(hostile_files, tmp_path):
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
def test_placement_field_wrong_type_or_range(hostile_files, tmp_path, field, value):
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


def test_placement_layout_puts_rows_on_their_layers(hostile_files, tmp_path):
    """The good placement's MoE rows land on layers 1..3 of 4, the dense row 0 contiguous."""
    p = json.loads(json.dumps(PLACEMENT))
    p["phy2log"] = [np.roll(np.arange(8), s).tolist() for s in (1, 2, 3)]
    (tmp_path / "p.json").write_text(json.dumps(p))
    assert run(["export", "--placement", "p.json", "--to", "sglang", "--out", "o.json"], tmp_path)[0] == 0
    rows = json.loads((tmp_path / "o.json").read_text())["physical_to_logical_map"]
    assert rows == [list(range(8))] + p["phy2log"]
