"""RoutingTrace: Parquet round trip, validation (in memory and on disk), atomic writes, ops."""

from __future__ import annotations

import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bad_traces import BAD_ROW, ROW_MUTATIONS
from conftest import (build_trace, copy_trace, read_block, replace_column, rewrite,
                      write_unchecked)
from sempar.errors import InputError
from sempar.trace import (FORMAT_VERSION, RoutingTrace, TraceMeta, TraceWriter, concat,
                          read_header, read_trace, select_domains, split_by_request,
                          split_by_token, trace_info, write_trace)


def assert_same_trace(a: RoutingTrace, b: RoutingTrace) -> None:
    assert a.meta == b.meta
    for name in ("token_id", "request_id", "position", "experts"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        assert np.array_equal(x, y), name
    assert a.domains == b.domains
    if a.domain is None:
        assert b.domain is None
    else:
        assert b.domain is not None and np.array_equal(a.domain, b.domain)
    if a.weights is None:
        assert b.weights is None
    else:
        assert b.weights is not None and np.array_equal(a.weights, b.weights)


def leftovers(folder, keep=()):
    return sorted(n for n in os.listdir(folder) if n not in keep)


# ============================================================================================
# 1. Round trip
# ============================================================================================

@pytest.mark.parametrize("with_weights", [True, False])
def test_round_trip_arrays_dtypes_meta(tmp_path, with_weights):
    t = build_trace(weights=with_weights, shared_experts=1, layer_ids=(3, 5, 7),
                    extra={"generator": "unit", "seed": 7})
    p = tmp_path / "t.parquet"
    write_trace(t, p)
    r = read_trace(p)
    assert_same_trace(t, r)
    assert r.token_id.dtype == np.int32
    assert r.request_id.dtype == np.int32
    assert r.position.dtype == np.int32
    assert r.experts.dtype == np.uint8 and r.experts.shape == (200, 3, 2)
    assert r.domain.dtype == np.int16
    assert r.domains == ["code", "math"]
    if with_weights:
        assert r.weights.dtype == np.float32 and r.weights.shape == (200, 3, 2)
    else:
        assert r.weights is None
    assert r.meta.layer_ids == (3, 5, 7)
    assert r.meta.shared_experts == 1
    assert r.meta.extra == {"generator": "unit", "seed": 7}
    # Unknown-domain rows (request 19) stay unknown.
    names = r.domain_names()
    assert list(names[:10]) == ["code"] * 10
    assert list(names[10:20]) == ["math"] * 10
    assert list(names[190:]) == [None] * 10


@pytest.mark.parametrize("version", [1, 2, 3])
def test_metadata_block_contents(tmp_path, trace, version):
    p = tmp_path / "t.parquet"
    write_trace(trace, p, format_version=version)
    block = read_block(p)
    assert FORMAT_VERSION == 3 and block["format_version"] == version
    assert block["num_tokens"] == 200
    assert block["num_requests"] == 20
    assert block["domains"] == ["code", "math"]
    assert block["meta"]["num_layers"] == 3 and block["meta"]["num_experts"] == 8
    assert block["meta"]["top_k"] == 2 and block["meta"]["vocab_size"] == 1000
    schema = pq.ParquetFile(p).schema_arrow
    if version == 1:
        assert schema.field("experts").type == pa.list_(pa.int16(), 6)
        assert schema.field("weights").type == pa.list_(pa.float32(), 6)
    else:   # 6 little-endian int16 ids, 6 float32 weights per row
        assert schema.field("experts").type == pa.binary(12)
        assert schema.field("weights").type == pa.binary(24)
    assert_same_trace(trace, read_trace(p))
    pf, blk, meta = read_header(p)
    assert meta == trace.meta and blk == block


@pytest.mark.parametrize("version", [1, 2, 3])
def test_experts_layout_is_layer_major(tmp_path, trace, version):
    p = tmp_path / "t.parquet"
    write_trace(trace, p, format_version=version)
    row = pq.read_table(p).column("experts")[BAD_ROW].as_py()
    if version >= 2:
        row = np.frombuffer(row, "<i2").tolist()
    assert row == trace.experts[BAD_ROW].reshape(-1).tolist()


@pytest.mark.parametrize("rgs", [16, 1000])
def test_format_1_and_2_read_alike(tmp_path, trace, rgs):
    """Format 1 files (the committed dev traces, files in the wild) keep reading, equal to the
    format 2 file of the same trace, through every reader."""
    write_trace(trace, tmp_path / "v1.parquet", row_group_size=rgs, format_version=1)
    write_trace(trace, tmp_path / "v2.parquet", row_group_size=rgs)
    a, b = read_trace(tmp_path / "v1.parquet"), read_trace(tmp_path / "v2.parquet")
    assert_same_trace(trace, a)
    assert_same_trace(a, b)
    assert trace_info(tmp_path / "v1.parquet") == trace_info(tmp_path / "v2.parquet")
    for opt in ((), ("weights",), ("domain",)):
        assert_same_trace(read_trace(tmp_path / "v1.parquet", optional=opt),
                          read_trace(tmp_path / "v2.parquet", optional=opt))


@pytest.mark.parametrize("case", sorted(ROW_MUTATIONS))
def test_bad_rows_of_format_1_files(tmp_path, case):
    """Format 1 files obey the same row rules (format 2's are the bad_file cases)."""
    mutate, kw = ROW_MUTATIONS[case]
    t = build_trace(**kw)
    message = mutate(t)
    p = write_unchecked(t, tmp_path / "bad.parquet", format_version=1)
    assert read_block(p)["format_version"] == 1
    with pytest.raises(InputError) as e:
        read_trace(p)
    assert str(e.value) == message


def _as_list(table):
    """Format 2's binary expert rows as format 1's fixed-size lists (in a format 2 file)."""
    rows = np.frombuffer(table.column("experts").combine_chunks().buffers()[1], "<i2")
    return replace_column(table, "experts", pa.FixedSizeListArray.from_arrays(pa.array(rows), 6))


def _narrow_binary(table):
    w = table.column("weights").combine_chunks()
    rows = np.frombuffer(w.buffers()[1], np.uint8).reshape(len(w), 24)[:, :16].copy()
    arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(w), [None, pa.py_buffer(rows)])
    return replace_column(table, "weights", arr)


@pytest.mark.parametrize("edit, version, message", [
    (_as_list, 2, "experts: column type fixed_size_list<element: int16>[6] is not fixed_size_binary "
                  "(format 2)"),
    (_narrow_binary, 2, "weights: rows hold 4 values but metadata says num_layers 3 x top_k 2 = 6"),
    (None, 1, "experts: column type fixed_size_binary[12] is not a list (format 1)"),
])
def test_row_column_types_follow_the_format(tmp_path, trace, edit, version, message):
    write_trace(trace, tmp_path / "a.parquet", row_group_size=16)
    p = rewrite(tmp_path / "a.parquet", tmp_path / "b.parquet", table_edit=edit,
                block_edit=lambda b: b.update(format_version=version))
    for reader in (read_trace, trace_info):
        with pytest.raises(InputError) as e:
            reader(p)
        assert str(e.value) == message


def test_round_trip_without_domains(tmp_path):
    t = build_trace(domains=None)
    p = tmp_path / "t.parquet"
    write_trace(t, p)
    assert "domain" not in pq.ParquetFile(p).schema_arrow.names
    r = read_trace(p)
    assert_same_trace(t, r)
    assert r.domain is None and r.domains == []
    assert trace_info(p)["domains"] == {}


def test_round_trip_domain_with_no_tokens(tmp_path):
    t = build_trace(domains=("code", "math", "web"))
    t.domain[t.domain == 2] = 0  # nobody is "web"
    p = tmp_path / "t.parquet"
    write_trace(t, p)
    r = read_trace(p)
    assert_same_trace(t, r)
    assert r.domains == ["code", "math", "web"]
    # Requests r%3: 0 -> code, 1 -> math, 2 -> web (moved to code); request 19 unknown.
    expected = {"code": int((t.domain == 0).sum()), "math": int((t.domain == 1).sum()), "web": 0}
    assert expected == {"code": 130, "math": 60, "web": 0}
    assert r.domain_counts() == expected
    assert trace_info(p)["domains"] == expected


def test_round_trip_all_rows_unknown_domain(tmp_path):
    t = build_trace(domains=("code",))
    t.domain[:] = -1
    p = tmp_path / "t.parquet"
    write_trace(t, p)
    r = read_trace(p)
    assert r.domains == ["code"]
    assert np.array_equal(r.domain, np.full(200, -1, np.int16))
    assert trace_info(p)["domains"] == {"code": 0}


# a refused write leaves no half-closed writer behind to print a traceback at exit
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("with_weights", [True, False])
def test_empty_trace_is_refused(tmp_path, with_weights):
    """A 0-row trace made `place` crash and `evaluate` print NaN: refused both ways."""
    t = build_trace(T=0, R=0, weights=with_weights)
    assert t.num_tokens == 0
    p = tmp_path / "t.parquet"
    with pytest.raises(InputError, match="no tokens to write"):
        write_trace(t, p)
    assert list(tmp_path.iterdir()) == []
    import json

    from sempar.trace.io import META_KEY, SUM_KEY, arrow_schema, block_checksum
    block = json.dumps({"format_version": FORMAT_VERSION, "meta": t.meta.to_json(),
                        "domains": t.domains, "num_tokens": 0, "num_requests": 0}).encode()
    schema = arrow_schema(t.meta, True, with_weights).with_metadata(
        {META_KEY: block, SUM_KEY: block_checksum(block)})
    pq.write_table(schema.empty_table(), p)
    for reader in (read_trace, trace_info):
        with pytest.raises(InputError, match="holds no tokens"):
            reader(p)


@pytest.mark.parametrize("rgs, groups", [(1, 200), (16, 13), (64, 4), (200, 1), (1000, 1)])
def test_round_trip_row_groups(tmp_path, trace, rgs, groups):
    p = tmp_path / "t.parquet"
    write_trace(trace, p, row_group_size=rgs)
    md = pq.ParquetFile(p).metadata
    assert md.num_row_groups == groups
    assert md.num_rows == 200
    assert md.row_group(0).num_rows == min(rgs, 200)
    assert_same_trace(trace, read_trace(p))
    assert trace_info(p) == trace.info()


def test_int32_expert_ids_for_large_models(tmp_path):
    t = build_trace(T=40, R=4, N=40000, k=2, weights=False, domains=None)
    assert t.experts.dtype == np.int32 and int(t.experts.max()) > 32767
    p = tmp_path / "t.parquet"
    write_trace(t, p, row_group_size=16)
    r = read_trace(p)
    assert r.experts.dtype == np.int32
    assert_same_trace(t, r)


def test_trace_info_counts(tmp_path, trace):
    p = tmp_path / "t.parquet"
    write_trace(trace, p, row_group_size=16)
    info = trace_info(p)
    assert info == {"tokens": 200, "requests": 20, "layers": 3, "experts": 8, "top_k": 2,
                    "domains": {"code": 100, "math": 90}, "model": "toy-moe",
                    "shared_experts": 0, "vocab_size": 1000, "has_weights": True,
                    "has_token_ids": True, "slots_sorted": True}
    assert info == trace.info()


def test_trace_info_counts_requests_across_row_groups(tmp_path):
    # 210 tokens in 7 requests of 30 tokens: requests straddle the 16-row groups.
    t = build_trace(T=210, R=7, weights=False)
    p = tmp_path / "t.parquet"
    write_trace(t, p, row_group_size=16)
    info = trace_info(p)
    assert info["tokens"] == 210 and info["requests"] == 7
    assert info["domains"] == {"code": 90, "math": 90}  # requests 0,2,4 / 1,3,5; 6 is unknown
    assert info["has_weights"] is False


def test_unchecked_writer_and_rewrite_helpers_are_faithful(tmp_path, trace):
    """The helpers that make bad files must produce a good file when given good data."""
    p1 = write_unchecked(trace, tmp_path / "a.parquet")
    assert pq.ParquetFile(p1).metadata.num_row_groups == 13
    assert_same_trace(trace, read_trace(p1))
    p2 = rewrite(p1, tmp_path / "b.parquet")
    assert pq.ParquetFile(p2).metadata.num_row_groups == 13
    assert_same_trace(trace, read_trace(p2))


def test_variable_length_list_columns_are_accepted(tmp_path, trace):
    write_trace(trace, tmp_path / "a.parquet", format_version=1)

    def to_var_lists(table):
        for col in ("experts", "weights"):
            typ = table.schema.field(col).type.value_type
            table = replace_column(table, col, pa.array(table.column(col).to_pylist(), pa.list_(typ)))
        return table
    p = rewrite(tmp_path / "a.parquet", tmp_path / "b.parquet", table_edit=to_var_lists)
    assert pa.types.is_list(pq.ParquetFile(p).schema_arrow.field("experts").type)
    assert_same_trace(trace, read_trace(p))


def test_plain_string_domain_column_is_accepted(tmp_path, trace):
    write_trace(trace, tmp_path / "a.parquet")

    def to_strings(table):
        return replace_column(table, "domain", pa.array(trace.domain_names().tolist(), pa.string()),
                              nullable=True)
    p = rewrite(tmp_path / "a.parquet", tmp_path / "b.parquet", table_edit=to_strings)
    assert_same_trace(trace, read_trace(p))


# ============================================================================================
# 2. Validation: in memory
# ============================================================================================

@pytest.mark.parametrize("case", sorted(ROW_MUTATIONS))
def test_validate_in_memory(case):
    mutate, kw = ROW_MUTATIONS[case]
    t = build_trace(**kw)
    t.validate()  # valid before the mutation
    message = mutate(t)
    with pytest.raises(InputError) as e:
        t.validate()
    assert str(e.value) == message
    assert "\n" not in str(e.value)


def test_validate_returns_self(trace):
    assert trace.validate() is trace


def test_group_limit_respected_is_valid():
    t = build_trace(k=3, groups=(4, 2))
    per_group = t.experts // 2
    n_groups = np.array([[len(set(row)) for row in tok] for tok in per_group.tolist()])
    assert n_groups.max() == 2  # the generator really uses two groups
    t.validate()


def test_group_limit_allows_two_groups_but_not_three():
    t = build_trace(k=3, groups=(4, 2))
    t.experts[5, 0] = [0, 1, 7]  # groups 0 and 3: fine
    t.validate()
    t.experts[5, 0] = [1, 3, 7]  # groups 0, 1, 3
    with pytest.raises(InputError, match=re.escape(
            "experts: row 5 layer 0: top-k [1, 3, 7] spans 3 expert groups, more than "
            "metadata.topk_groups 2")):
        t.validate()


@pytest.mark.parametrize("index", [2, -2])
def test_validate_domain_index_out_of_range(trace, index):
    trace.domain[BAD_ROW] = index
    with pytest.raises(InputError) as e:
        trace.validate()
    assert str(e.value) == (f"domain: row 37: index {index} names no domain "
                            "(known: ['code', 'math'])")


def test_validate_request_id_negative(trace):
    trace.request_id[BAD_ROW] = -4
    with pytest.raises(InputError, match=r"^request_id: row 37: value -4 is negative$"):
        trace.validate()


def test_validate_reports_first_bad_row(trace):
    trace.experts[150, 0, 0] = 9
    trace.experts[BAD_ROW, 2, 1] = 8
    with pytest.raises(InputError, match=r"^experts: row 37 layer 2 slot 1: expert id 8 "):
        trace.validate()


@pytest.mark.parametrize("shape, message", [
    ((200, 2, 2), "experts: 2 layers but metadata.num_layers is 3"),
    ((200, 3, 3), "experts: top-k of 3 but metadata.top_k is 2"),
    ((199, 3, 2), "experts: shape (199, 3, 2) is not (tokens=200, layers, top_k)"),
    ((200, 6), "experts: shape (200, 6) is not (tokens=200, layers, top_k)"),
])
def test_validate_experts_shape(trace, shape, message):
    n = int(np.prod(shape))
    trace.experts = (np.arange(n) % 8).astype(np.int16).reshape(shape)
    trace.weights = None
    with pytest.raises(InputError) as e:
        trace.validate()
    assert str(e.value) == message


def test_validate_weights_shape(trace):
    trace.weights = trace.weights[:, :, :1]
    with pytest.raises(InputError, match=re.escape(
            "weights: shape (200, 3, 1) differs from experts (200, 3, 2)")):
        trace.validate()


def test_validate_float_experts_rejected(trace):
    trace.experts = trace.experts.astype(np.float32)
    with pytest.raises(InputError, match=r"^experts: dtype float32 is not an integer type$"):
        trace.validate()


@pytest.mark.parametrize("kw, message", [
    (dict(num_layers=0), "metadata.num_layers: 0 is not a positive integer"),
    (dict(vocab_size=-5), "metadata.vocab_size: -5 is not a positive integer"),
    (dict(top_k=True), "metadata.top_k: True is not a positive integer"),
    (dict(top_k=9), "metadata.top_k: 9 exceeds num_experts 8"),
    (dict(shared_experts=-1), "metadata.shared_experts: -1 is negative"),
    (dict(num_expert_groups=3), "metadata.num_expert_groups: 3 does not divide num_experts 8"),
    (dict(num_expert_groups=4, topk_groups=5), "metadata.topk_groups: 5 is not in [1, 4]"),
    (dict(layer_ids=(0, 1)), "metadata.layer_ids: 2 ids for 3 layers"),
])
def test_trace_meta_rejects_bad_shapes(kw, message):
    args = dict(model="m", num_layers=3, num_experts=8, top_k=2, vocab_size=100)
    args.update(kw)
    with pytest.raises(InputError) as e:
        TraceMeta(**args)
    assert str(e.value) == message


# ============================================================================================
# 2b. Validation: files on disk (bad_file fixture in bad_traces.py; the CLI side is in
#     test_trace_cli.py)
# ============================================================================================

def test_read_trace_rejects_bad_file(bad_file):
    path, pattern = bad_file
    with pytest.raises(InputError) as e:
        read_trace(path)
    assert re.fullmatch(pattern, str(e.value)), str(e.value)
    assert "\n" not in str(e.value)


def test_trace_info_rejects_bad_file(bad_file):
    path, pattern = bad_file
    with pytest.raises(InputError) as e:
        trace_info(path)
    assert re.fullmatch(pattern, str(e.value)), str(e.value)


@pytest.mark.parametrize("case", sorted(ROW_MUTATIONS))
def test_bad_row_sits_in_a_later_row_group(tmp_path, case):
    """The row-level defects really are on disk at row 37, in row group 2 of 16-row groups."""
    mutate, kw = ROW_MUTATIONS[case]
    t = build_trace(**kw)
    mutate(t)
    p = write_unchecked(t, tmp_path / "bad.parquet", row_group_size=16)
    md = pq.ParquetFile(p).metadata
    assert md.num_row_groups == 13
    assert md.row_group(2).num_rows == 16  # rows 32..47
    # The file holds the original rows: read back without validation, except that an expert id
    # out of range is refused even then (narrowing it to the in-memory uint8 would wrap it), so
    # those are compared on the stored int16 ids.
    col = pq.read_table(p).column("experts").combine_chunks()
    stored = np.frombuffer(col.buffers()[1], "<i2").reshape(t.experts.shape)
    assert np.array_equal(stored, t.experts)
    if t.experts.min() < 0 or t.experts.max() >= t.meta.num_experts:
        with pytest.raises(InputError, match=r"^experts: row 37 layer \d slot \d: expert id "):
            read_trace(p, validate=False)
        return
    r = read_trace(p, validate=False)
    assert np.array_equal(r.token_id, t.token_id)
    assert np.array_equal(r.experts, t.experts)


def test_bad_row_in_first_row_group_reports_its_row(tmp_path, trace):
    trace.experts[3, 0, 1] = 12
    p = write_unchecked(trace, tmp_path / "bad.parquet")
    with pytest.raises(InputError, match=r"^experts: row 3 layer 0 slot 1: expert id 12 "):
        read_trace(p)


def test_bad_row_in_last_row_group_reports_its_row(tmp_path, trace):
    trace.token_id[199] = 5000
    p = write_unchecked(trace, tmp_path / "bad.parquet")
    with pytest.raises(InputError, match=re.escape(
            "token_id: row 199: value 5000 out of range [0, 1000)")):
        read_trace(p)


def test_num_requests_wrong_rejected_by_read_trace(tmp_path, trace):
    write_trace(trace, tmp_path / "a.parquet", row_group_size=16)
    p = rewrite(tmp_path / "a.parquet", tmp_path / "b.parquet",
                block_edit=lambda b: b.update(num_requests=21))
    with pytest.raises(InputError) as e:
        read_trace(p)
    assert str(e.value) == "metadata.num_requests: 21 but the file holds 20 distinct request ids"


def test_num_requests_wrong_rejected_by_trace_info(tmp_path, trace):
    write_trace(trace, tmp_path / "a.parquet", row_group_size=16)
    p = rewrite(tmp_path / "a.parquet", tmp_path / "b.parquet",
                block_edit=lambda b: b.update(num_requests=21))
    with pytest.raises(InputError, match=r"^metadata\.num_requests: 21 "):
        trace_info(p)


def _narrow_weights(table):
    w = table.column("weights").combine_chunks()
    rows = len(w)
    flat = w.flatten().to_numpy()[: rows * 4]
    return replace_column(table, "weights", pa.FixedSizeListArray.from_arrays(pa.array(flat), 4))


def test_weights_width_mismatch_is_an_input_error(tmp_path, trace):
    write_trace(trace, tmp_path / "a.parquet", row_group_size=16, format_version=1)
    p = rewrite(tmp_path / "a.parquet", tmp_path / "b.parquet", table_edit=_narrow_weights)
    with pytest.raises(InputError, match=r"^weights: "):
        read_trace(p)


@pytest.mark.parametrize("column", ["token_id", "experts"])
def test_wide_integer_column_does_not_wrap(tmp_path, trace, column):
    write_trace(trace, tmp_path / "a.parquet", row_group_size=16, format_version=1)
    if column == "token_id":
        tid = trace.token_id.astype(np.int64)
        tid[BAD_ROW] = 2**32 + 5
        edit = lambda tb: replace_column(tb, "token_id", pa.array(tid))  # noqa: E731
        pattern = r"^token_id: row 37: value 4294967301 "
    else:
        ex = trace.experts.astype(np.int32).reshape(200, 6)
        ex[BAD_ROW, 0] += 65536  # wraps back onto the original (valid, distinct) id in int16
        edit = lambda tb: replace_column(  # noqa: E731
            tb, "experts", pa.FixedSizeListArray.from_arrays(pa.array(ex.reshape(-1)), 6))
        pattern = rf"^experts: row 37 layer 0 slot 0: expert id {65536 + int(trace.experts[37, 0, 0])} "
    p = rewrite(tmp_path / "a.parquet", tmp_path / "b.parquet", table_edit=edit)
    with pytest.raises(InputError, match=pattern):
        read_trace(p)


def test_meta_with_wrong_type_is_an_input_error(tmp_path, trace):
    write_trace(trace, tmp_path / "a.parquet")
    p = rewrite(tmp_path / "a.parquet", tmp_path / "b.parquet",
                block_edit=lambda b: b["meta"].update(num_layers="3"))
    with pytest.raises(InputError, match=r"^metadata\.num_layers: '3' is not a positive integer$"):
        read_trace(p)


def test_unknown_meta_keys_are_ignored(tmp_path, trace):
    write_trace(trace, tmp_path / "a.parquet")
    p = rewrite(tmp_path / "a.parquet", tmp_path / "b.parquet",
                block_edit=lambda b: b["meta"].update(future_field=1))
    assert_same_trace(trace, read_trace(p))


# ============================================================================================
# 3. Atomic writes
# ============================================================================================

class Boom(RuntimeError):
    pass


def test_writer_exception_leaves_nothing(tmp_path, trace):
    target = tmp_path / "out.parquet"
    with pytest.raises(Boom):
        with TraceWriter(target, trace.meta, trace.domains, has_weights=True) as w:
            w.write(trace.token_id[:50], trace.request_id[:50], trace.position[:50],
                    trace.experts[:50], trace.domain[:50], trace.weights[:50])
            # Mid-way the temporary file exists beside the target, the target does not.
            assert not target.exists()
            assert len(leftovers(tmp_path)) == 1
            raise Boom("stop")
    assert not target.exists()
    assert leftovers(tmp_path) == []


def test_writer_keyboard_interrupt_leaves_nothing(tmp_path, trace):
    target = tmp_path / "out.parquet"
    with pytest.raises(KeyboardInterrupt):
        with TraceWriter(target, trace.meta, has_weights=False) as w:
            w.write(trace.token_id, trace.request_id, trace.position, trace.experts)
            raise KeyboardInterrupt
    assert leftovers(tmp_path) == []


def test_writer_exception_keeps_existing_target(tmp_path, trace):
    target = tmp_path / "out.parquet"
    write_trace(trace, target)
    before = target.read_bytes()
    other = build_trace(seed=5, weights=False, domains=None)
    with pytest.raises(Boom):
        with TraceWriter(target, other.meta) as w:
            w.write(other.token_id, other.request_id, other.position, other.experts)
            raise Boom("stop")
    assert target.read_bytes() == before
    assert leftovers(tmp_path) == ["out.parquet"]
    assert_same_trace(trace, read_trace(target))


def test_writer_validation_error_in_later_block(tmp_path, trace):
    target = tmp_path / "out.parquet"
    trace.experts[BAD_ROW, 0, 0] = 8
    with pytest.raises(InputError) as e:
        with TraceWriter(target, trace.meta, trace.domains, has_weights=True) as w:
            for lo in range(0, 200, 16):
                sl = slice(lo, lo + 16)
                w.write(trace.token_id[sl], trace.request_id[sl], trace.position[sl],
                        trace.experts[sl], trace.domain[sl], trace.weights[sl])
    # TraceWriter reports the row in file coordinates, not inside the block.
    assert str(e.value) == "experts: row 37 layer 0 slot 0: expert id 8 out of range [0, 8)"
    assert leftovers(tmp_path) == []


def test_writer_weights_in_some_blocks_only(tmp_path, trace):
    target = tmp_path / "out.parquet"
    with pytest.raises(InputError, match="^weights: given for some blocks of the trace but not "
                                         "for others$"):
        with TraceWriter(target, trace.meta, has_weights=True) as w:
            w.write(trace.token_id[:16], trace.request_id[:16], trace.position[:16],
                    trace.experts[:16], weights=trace.weights[:16])
            w.write(trace.token_id[16:], trace.request_id[16:], trace.position[16:],
                    trace.experts[16:])
    assert leftovers(tmp_path) == []


def test_write_trace_invalid_leaves_nothing(tmp_path, trace):
    target = tmp_path / "out.parquet"
    trace.weights[BAD_ROW, 1, 0] = np.nan
    with pytest.raises(InputError, match=r"^weights: row 37 layer 1 slot 0: value nan "):
        write_trace(trace, target, row_group_size=16)
    assert leftovers(tmp_path) == []


def test_write_trace_invalid_keeps_existing_target(tmp_path, trace):
    target = tmp_path / "out.parquet"
    write_trace(trace, target)
    before = target.read_bytes()
    bad = copy_trace(trace)
    bad.token_id[BAD_ROW] = 1000
    with pytest.raises(InputError, match=r"^token_id: row 37: value 1000 "):
        write_trace(bad, target)
    assert target.read_bytes() == before
    assert leftovers(tmp_path) == ["out.parquet"]


def test_successful_write_leaves_only_target(tmp_path, trace):
    target = tmp_path / "sub" / "out.parquet"
    write_trace(trace, target, row_group_size=16)
    write_trace(build_trace(seed=9), target)  # overwrite in place
    assert leftovers(tmp_path / "sub") == ["out.parquet"]
    assert_same_trace(build_trace(seed=9), read_trace(target))


# ============================================================================================
# 4. ops
# ============================================================================================

@pytest.mark.parametrize("R", [10, 13, 20])
def test_split_by_request_default(R):
    t = build_trace(T=R * 10, R=R)
    fit, ev = split_by_request(t)
    f_req, e_req = set(fit.request_id.tolist()), set(ev.request_id.tolist())
    assert f_req.isdisjoint(e_req)
    assert f_req | e_req == set(range(R))
    assert len(f_req) == round(0.2 * R) == {10: 2, 13: 3, 20: 4}[R]
    assert fit.num_tokens + ev.num_tokens == t.num_tokens
    # Each part keeps the original order and complete rows.
    in_fit = np.isin(t.request_id, list(f_req))
    assert np.array_equal(fit.experts, t.experts[in_fit])
    assert np.array_equal(ev.token_id, t.token_id[~in_fit])
    assert np.array_equal(fit.weights, t.weights[in_fit])
    assert fit.domains == ev.domains == t.domains
    fit.validate(), ev.validate()


def test_split_by_request_seeded(trace):
    a1, _ = split_by_request(trace, seed=1)
    a2, _ = split_by_request(trace, seed=1)
    b, _ = split_by_request(trace, seed=2)
    assert np.array_equal(a1.request_id, a2.request_id)
    assert set(a1.request_id.tolist()) != set(b.request_id.tolist())


def test_split_by_request_fraction(trace):
    fit, ev = split_by_request(trace, fit_fraction=0.5, seed=3)
    assert len(set(fit.request_id.tolist())) == 10
    assert len(set(ev.request_id.tolist())) == 10
    fit, ev = split_by_request(trace, fit_fraction=0.01)  # at least one request each side
    assert fit.num_requests == 1 and ev.num_requests == 19
    fit, ev = split_by_request(trace, fit_fraction=0.99)
    assert fit.num_requests == 19 and ev.num_requests == 1


@pytest.mark.parametrize("frac", [0.0, 1.0, -0.1, 1.5])
def test_split_by_request_bad_fraction(trace, frac):
    with pytest.raises(InputError, match=r"^fit_fraction: "):
        split_by_request(trace, fit_fraction=frac)


def test_split_by_request_single_request():
    t = build_trace(T=30, R=1)
    with pytest.raises(InputError, match=r"^request_id: the trace holds 1 request\(s\)"):
        split_by_request(t)


def test_split_by_token():
    t = build_trace(T=10000, R=100, weights=False)
    fit, score = split_by_token(t, 0.25, seed=4)
    assert fit.dtype == bool and fit.shape == (10000,)
    assert np.array_equal(score, ~fit)
    assert abs(fit.mean() - 0.25) < 0.02
    again, _ = split_by_token(t, 0.25, seed=4)
    other, _ = split_by_token(t, 0.25, seed=5)
    assert np.array_equal(fit, again)
    assert not np.array_equal(fit, other)
    fit75, _ = split_by_token(t, 0.75, seed=4)
    assert abs(fit75.mean() - 0.75) < 0.02
    with pytest.raises(InputError, match=r"^fit_fraction: "):
        split_by_token(t, 1.0)


def test_concat_shifts_request_ids_and_merges_domains():
    a = build_trace(T=100, R=10, domains=("code", "math"), seed=1)
    b = build_trace(T=60, R=6, domains=("math", "web"), seed=2)
    c = concat([a, b])
    assert c.num_tokens == 160
    assert c.num_requests == 16
    assert np.array_equal(c.request_id[:100], a.request_id)
    assert np.array_equal(c.request_id[100:], b.request_id + 10)
    assert c.request_id.dtype == np.int32
    assert c.domains == ["code", "math", "web"]
    assert list(c.domain_names()) == list(a.domain_names()) + list(b.domain_names())
    assert c.domain_counts() == {"code": 50, "math": 40 + 30, "web": 20}
    assert np.array_equal(c.experts, np.concatenate([a.experts, b.experts]))
    assert np.array_equal(c.weights, np.concatenate([a.weights, b.weights]))
    c.validate()


def test_concat_same_request_ids_stay_distinct():
    a = build_trace(T=50, R=5, seed=1)
    c = concat([a, a, a])
    assert c.num_requests == 15
    assert sorted(set(c.request_id.tolist())) == list(range(15))


def test_concat_with_and_without_domains(tmp_path):
    a = build_trace(T=40, R=4, domains=None, seed=1)
    b = build_trace(T=40, R=4, domains=("web",), seed=2)
    c = concat([a, b])
    assert c.domains == ["web"]
    assert np.array_equal(c.domain[:40], np.full(40, -1))
    assert c.domain_counts() == {"web": 30}
    write_trace(c, tmp_path / "c.parquet")
    assert trace_info(tmp_path / "c.parquet")["requests"] == 8
    assert concat([a, a]).domain is None


@pytest.mark.parametrize("kw, field", [
    (dict(L=4), "num_layers"), (dict(N=16), "num_experts"), (dict(k=3), "top_k"),
    (dict(shared_experts=2), "shared_experts"), (dict(layer_ids=(0, 1, 9)), "layer_ids"),
])
def test_concat_refuses_mismatched_shapes(kw, field):
    a = build_trace(T=40, R=4)
    b = build_trace(T=40, R=4, **kw)
    with pytest.raises(InputError, match=rf"^metadata\.{field}: trace 1 has "):
        concat([a, b])


def test_concat_refuses_mixed_weights_and_empty():
    a = build_trace(T=40, R=4)
    with pytest.raises(InputError, match=r"^weights: "):
        concat([a, build_trace(T=40, R=4, weights=False)])
    with pytest.raises(InputError, match=r"^concat: no traces given$"):
        concat([])


@pytest.mark.parametrize("first_kw, second_kw, fix", [
    (dict(vocab=100), dict(vocab=1000), "vocab"),
    (dict(k=3, groups=(4, 2)), dict(k=3), "groups"),
])
def test_concat_result_is_valid_or_refused(first_kw, second_kw, fix):
    a = build_trace(T=40, R=4, **first_kw)
    b = build_trace(T=40, R=4, seed=3, **second_kw)
    if fix == "vocab":
        b.token_id[0] = 999
    else:
        b.experts[0, 0] = [0, 2, 4]
    b.validate()
    try:
        c = concat([a, b])
    except InputError:
        return
    c.validate()


def test_select_domains(trace):
    m = select_domains(trace, ["math"])
    assert m.num_tokens == 90
    assert set(m.domain_names().tolist()) == {"math"}
    assert m.domains == ["code", "math"]
    assert np.array_equal(m.request_id, trace.request_id[trace.domain == 1])
    both = select_domains(trace, ["code", "math"])
    assert both.num_tokens == 190  # the unknown-domain request is left out
    assert select_domains(trace, []).num_tokens == 0
    with pytest.raises(InputError, match=r"^domain: 'web' is not in this trace \(it has: code, math\)$"):
        select_domains(trace, ["code", "web"])
