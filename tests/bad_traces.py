"""Corrupted trace files, shared by the read_trace tests (test_trace_io.py) and the CLI tests
(test_trace_cli.py); conftest.py loads this module as a plugin for the `bad_file` fixture.

Every case puts its defect at row 37 (row group 2 of 16-row groups) where rows make sense, and
gives the exact one-line message (a regular expression matched in full) that the readers must
raise."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import build_trace, replace_column, rewrite, write_unchecked
from sempar.trace import RoutingTrace

BAD_ROW = 37


def _row_case(mutate: Callable[[RoutingTrace], str], **build_kw: Any):
    def make(tmp: Path) -> tuple[Path, str]:
        t = build_trace(**build_kw)
        message = mutate(t)
        return write_unchecked(t, tmp / "bad.parquet"), re_exact(message)
    return make


def re_exact(message: str) -> str:
    return re.escape(message)


def _neg_expert(t):
    t.experts = t.experts.astype(np.int16)      # -1 has no uint8 (in-memory) form; files hold int16
    t.experts[BAD_ROW, 1, 0] = -1
    return "experts: row 37 layer 1 slot 0: expert id -1 out of range [0, 8)"


def _big_expert(t):
    t.experts[BAD_ROW, 2, 1] = 8
    return "experts: row 37 layer 2 slot 1: expert id 8 out of range [0, 8)"


def _dup_expert(t):
    e = int(t.experts[BAD_ROW, 1, 0])
    t.experts[BAD_ROW, 1, 1] = e
    return f"experts: row 37 layer 1: duplicate expert in top-k [{e}, {e}]"


def _nan_weight(t):
    t.weights[BAD_ROW, 0, 1] = np.nan
    return "weights: row 37 layer 0 slot 1: value nan is not a finite non-negative number"


def _neg_weight(t):
    t.weights[BAD_ROW, 2, 0] = -0.25
    return "weights: row 37 layer 2 slot 0: value -0.25 is not a finite non-negative number"


def _inf_weight(t):
    t.weights[BAD_ROW, 1, 1] = np.inf
    return "weights: row 37 layer 1 slot 1: value inf is not a finite non-negative number"


def _big_token(t):
    t.token_id[BAD_ROW] = 1000
    return "token_id: row 37: value 1000 out of range [0, 1000)"


def _neg_token(t):
    t.token_id[BAD_ROW] = -3
    return "token_id: row 37: value -3 out of range [0, 1000)"


def _neg_position(t):
    t.position[BAD_ROW] = -1
    return "position: row 37: value -1 is negative"


def _group_span(t):
    t.experts[BAD_ROW, 1] = [0, 2, 4]  # groups 0, 1 and 2 of 4 groups of 2 experts
    return ("experts: row 37 layer 1: top-k [0, 2, 4] spans 3 expert groups, more than "
            "metadata.topk_groups 2")


GROUPS_KW = dict(k=3, groups=(4, 2))

ROW_MUTATIONS = {
    "expert_negative": (_neg_expert, {}),
    "expert_ge_num_experts": (_big_expert, {}),
    "duplicate_expert": (_dup_expert, {}),
    "weight_nan": (_nan_weight, {}),
    "weight_negative": (_neg_weight, {}),
    "weight_inf": (_inf_weight, {}),
    "token_id_ge_vocab": (_big_token, {}),
    "token_id_negative": (_neg_token, {}),
    "position_negative": (_neg_position, {}),
    "group_limit_violated": (_group_span, GROUPS_KW),
}


def _valid_file(tmp: Path, format_version: int | None = None, **kw: Any) -> Path:
    from sempar.trace import FORMAT_VERSION, write_trace
    p = tmp / "valid.parquet"
    write_trace(build_trace(**kw), p, row_group_size=16,
                format_version=format_version or FORMAT_VERSION)
    return p


def _meta_case(edit: Callable[[dict], Any], message: str):
    def make(tmp: Path) -> tuple[Path, str]:
        return rewrite(_valid_file(tmp), tmp / "bad.parquet", block_edit=edit), re_exact(message)
    return make


def _set_meta(key: str, value: Any):
    def edit(block: dict) -> None:
        block["meta"][key] = value
    return edit


def _ragged(column: str, message: str):
    def make(tmp: Path) -> tuple[Path, str]:
        def edit(table: pa.Table) -> pa.Table:
            rows = table.column(column).to_pylist()
            rows[BAD_ROW] = rows[BAD_ROW][:5]
            value_type = table.schema.field(column).type.value_type
            return replace_column(table, column, pa.array(rows, pa.list_(value_type)))
        # lists can be ragged: format 1's columns (format 2's rows are fixed-size binary)
        return (rewrite(_valid_file(tmp, format_version=1), tmp / "bad.parquet", table_edit=edit),
                re_exact(message))
    return make


def _null_row(column: str, message: str):
    def make(tmp: Path) -> tuple[Path, str]:
        def edit(table: pa.Table) -> pa.Table:
            rows = table.column(column).to_pylist()
            rows[BAD_ROW] = None
            typ = table.schema.field(column).type
            if pa.types.is_fixed_size_list(typ):
                typ = pa.list_(typ.value_type)
            return replace_column(table, column, pa.array(rows, typ), nullable=True)
        return rewrite(_valid_file(tmp), tmp / "bad.parquet", table_edit=edit), re_exact(message)
    return make


def _unlisted_domain(tmp: Path) -> tuple[Path, str]:
    t = build_trace()
    t.domain[:] = 0
    t.domain[BAD_ROW] = 1  # the only "math" row
    from sempar.trace import write_trace
    write_trace(t, tmp / "valid.parquet", row_group_size=16)

    def edit(block: dict) -> None:
        block["domains"] = ["code"]
    return (rewrite(tmp / "valid.parquet", tmp / "bad.parquet", block_edit=edit),
            re_exact("domain: row 37: 'math' is not listed in metadata.domains ['code']"))


def _no_block(tmp: Path) -> tuple[Path, str]:
    table = pq.read_table(_valid_file(tmp)).replace_schema_metadata(None)
    p = tmp / "plain.parquet"
    pq.write_table(table, p)
    return p, re_exact(f"{p}: Parquet file has no 'sempar.trace' metadata block: not a sempar trace")


def _bad_json(tmp: Path) -> tuple[Path, str]:
    p = rewrite(_valid_file(tmp), tmp / "bad.parquet", raw_block=b'{"format_version": 1, "meta": ')
    return p, re_exact("metadata: the 'sempar.trace' block is not valid JSON")


def _missing_column(tmp: Path) -> tuple[Path, str]:
    p = rewrite(_valid_file(tmp), tmp / "bad.parquet",
                table_edit=lambda tb: tb.drop_columns(["request_id"]))
    return p, re_exact("request_id: column missing from the file")


def _domains_empty(tmp: Path) -> tuple[Path, str]:
    p = rewrite(_valid_file(tmp), tmp / "bad.parquet", block_edit=lambda b: b.update(domains=[]))
    return p, re_exact("metadata.domains: empty, but the file has a domain column")


def _truncated(tmp: Path) -> tuple[Path, str]:
    p = _valid_file(tmp)
    data = p.read_bytes()
    p.write_bytes(data[:-100])
    return p, re_exact(f"{p}: not a readable Parquet trace (truncated or another format: ") + r".+\)"


def _text_file(tmp: Path) -> tuple[Path, str]:
    p = tmp / "notes.parquet"
    p.write_text("token_id,request_id\n1,2\n3,4\n")
    return p, re_exact(f"{p}: not a readable Parquet trace (truncated or another format: ") + r".+\)"


def _empty_file(tmp: Path) -> tuple[Path, str]:
    p = tmp / "empty.parquet"
    p.write_bytes(b"")
    return p, re_exact(f"{p}: not a readable Parquet trace (truncated or another format: ") + r".+\)"


def _missing_file(tmp: Path) -> tuple[Path, str]:
    p = tmp / "nope.parquet"
    return p, re_exact(f"{p}: no such file")


def _folder(tmp: Path) -> tuple[Path, str]:
    p = tmp / "dir.parquet"
    p.mkdir()
    return p, re_exact(f"{p}: is a folder, not a trace file")


FILE_CASES: dict[str, Callable[[Path], tuple[Path, str]]] = {
    **{name: _row_case(mut, **kw) for name, (mut, kw) in ROW_MUTATIONS.items()},
    "ragged_experts": _ragged("experts", "experts: row 37: 5 values, expected 6 (ragged top-k)"),
    "ragged_weights": _ragged("weights", "weights: row 37: 5 values, expected 6 (ragged top-k)"),
    "null_experts_row": _null_row("experts", "experts: row 37: value is null"),
    "null_token_id": _null_row("token_id", "token_id: row 37: value is null"),
    "format_version_unknown": _meta_case(lambda b: b.update(format_version=4),
                                         "metadata.format_version: 4 is not supported "
                                         "(this sempar reads 1, 2, 3)"),
    "format_version_missing": _meta_case(lambda b: b.pop("format_version"),
                                         "metadata.format_version: None is not supported "
                                         "(this sempar reads 1, 2, 3)"),
    "num_tokens_wrong": _meta_case(lambda b: b.update(num_tokens=199),
                                   "metadata.num_tokens: 199 but the file holds 200 rows"),
    "num_layers_mismatch": _meta_case(_set_meta("num_layers", 2),
                                      "experts: rows hold 6 values but metadata says num_layers 2 "
                                      "x top_k 2 = 4"),
    "top_k_mismatch": _meta_case(_set_meta("top_k", 3),
                                 "experts: rows hold 6 values but metadata says num_layers 3 "
                                 "x top_k 3 = 9"),
    "vocab_size_missing": _meta_case(lambda b: b["meta"].pop("vocab_size"),
                                     "metadata: missing field 'vocab_size'"),
    "num_experts_zero": _meta_case(_set_meta("num_experts", 0),
                                   "metadata.num_experts: 0 is not a positive integer"),
    "domain_not_in_metadata": _unlisted_domain,
    "domains_empty_with_column": _domains_empty,
    "no_metadata_block": _no_block,
    "metadata_not_json": _bad_json,
    "column_missing": _missing_column,
    "truncated": _truncated,
    "text_file": _text_file,
    "empty_file": _empty_file,
    "missing_file": _missing_file,
    "folder": _folder,
}


@pytest.fixture(params=sorted(FILE_CASES))
def bad_file(request, tmp_path) -> tuple[Path, str]:
    """(path of a defective trace file, regex the one-line InputError message must match)."""
    return FILE_CASES[request.param](tmp_path)
