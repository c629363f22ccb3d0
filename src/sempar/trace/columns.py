"""Arrow columns of one trace row group -> numpy arrays, for both on-disk formats (trace/io.py).

Format 2 `experts` / `weights`: fixed_size_binary rows of L x k little-endian values
(`stored_dtype`, `WEIGHT_DTYPE`), each chunk's value buffer viewed by numpy in place; format 1:
(fixed-size or exactly-L x k variable) lists, flattened through their child array. Integer
columns are narrowed without wrapping; nulls, ragged rows and wrong types raise InputError
naming the row in file coordinates.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sempar.errors import InputError
from sempar.trace.schema import FORMAT_VERSION, TraceMeta

WEIGHT_DTYPE = np.dtype("<f4")


def stored_dtype(meta: TraceMeta) -> np.dtype:
    """The little-endian dtype of the ids in a format 2 `experts` row."""
    return meta.stored_dtype.newbyteorder("<")


def check_row_type(col: str, typ: pa.DataType, meta: TraceMeta, dtype: np.dtype,
                   version: int) -> None:
    """Formats 2 and 3: fixed_size_binary rows of L * k values of dtype; format 1: lists (fixed-size
    ones of L * k values)."""
    width = meta.num_layers * meta.top_k
    shape = f"num_layers {meta.num_layers} x top_k {meta.top_k} = {width}"
    if version == 1:
        if pa.types.is_fixed_size_binary(typ):
            raise InputError(f"{col}: column type {typ} is not a list (format 1)")
        if pa.types.is_fixed_size_list(typ) and typ.list_size != width:
            raise InputError(f"{col}: rows hold {typ.list_size} values but metadata says {shape}")
        return
    if not pa.types.is_fixed_size_binary(typ):
        raise InputError(f"{col}: column type {typ} is not fixed_size_binary (format {version})")
    if typ.byte_width != width * dtype.itemsize:
        held = (f"{typ.byte_width // dtype.itemsize} values" if typ.byte_width % dtype.itemsize == 0
                else f"{typ.byte_width} bytes, not whole {dtype.itemsize}-byte values,")
        raise InputError(f"{col}: rows hold {held} but metadata says {shape}")


def _binary_values(col: pa.ChunkedArray, width: int, field: str, row0: int,
                   dtype: np.dtype) -> np.ndarray:
    """A format 2 column (fixed_size_binary rows, type checked by read_header) as dtype[rows,
    width]: each chunk's value buffer viewed in place, no copy, no per-row objects."""
    parts = []
    for arr in col.chunks:
        if arr.null_count:
            r = int(np.argmax(arr.is_null().to_numpy(zero_copy_only=False)))
            raise InputError(f"{field}: row {row0 + r}: value is null")
        nbytes = arr.type.byte_width
        parts.append(np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr) * width,
                                   offset=arr.offset * nbytes).reshape(len(arr), width))
        row0 += len(arr)
    if not parts:
        return np.zeros((0, width), dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _list_values(col: pa.ChunkedArray, width: int, field: str, row0: int, dtype) -> np.ndarray:
    """Flatten a (fixed or variable) list column to dtype[rows, width]; ragged rows raise.

    A fixed-size list chunk without nulls is its child array: `flatten()` slices it and
    `to_numpy` wraps its buffer, so a single-chunk column comes back without a copy (and
    without a Python object per row or value)."""
    parts = []
    for arr in col.chunks:
        rows = len(arr)
        if arr.null_count:
            r = int(np.argmax(arr.is_null().to_numpy(zero_copy_only=False)))
            raise InputError(f"{field}: row {row0 + r}: value is null")
        if pa.types.is_fixed_size_list(arr.type):
            values = arr.flatten()
        elif pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
            bad = lengths != width
            if bad.any():
                r = int(np.argmax(bad))
                raise InputError(f"{field}: row {row0 + r}: {int(lengths[r])} values, expected "
                                 f"{width} (ragged top-k)")
            values = arr.flatten()
        else:
            raise InputError(f"{field}: column type {arr.type} is not a list")
        if values.null_count:
            i = int(np.argmax(values.is_null().to_numpy(zero_copy_only=False)))
            raise InputError(f"{field}: row {row0 + i // width}: null value at slot {i % width}")
        flat = values.to_numpy(zero_copy_only=False)
        parts.append(flat.reshape(rows, width) if dtype is None
                     else flat.astype(dtype, copy=False).reshape(rows, width))
        row0 += rows
    if not parts:
        return np.zeros((0, width), dtype or np.int16)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _narrow(x: np.ndarray, dtype, field: str, row0: int) -> np.ndarray:
    """x cast to integer `dtype`, refusing values that would wrap around."""
    if not np.issubdtype(x.dtype, np.integer):
        raise InputError(f"{field}: values of type {x.dtype} are not integers")
    info = np.iinfo(dtype)
    if x.dtype.itemsize > np.dtype(dtype).itemsize or x.dtype.kind != np.dtype(dtype).kind:
        bad = (x < info.min) | (x > info.max)
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{field}: row {row0 + i}: value {int(x[i])} does not fit "
                             f"{np.dtype(dtype).name}")
    return x.astype(dtype, copy=False)


def block_arrays(tab: pa.Table, meta: TraceMeta, domains: list[str], row0: int) -> dict[str, np.ndarray]:
    L, k = meta.num_layers, meta.top_k
    out: dict[str, np.ndarray] = {}
    for col in ("token_id", "request_id", "position"):
        if col in tab.column_names:
            c = tab.column(col)
            if c.null_count:
                r = int(np.argmax(c.is_null().to_numpy(zero_copy_only=False)))
                raise InputError(f"{col}: row {row0 + r}: value is null")
            if not pa.types.is_integer(c.type):
                raise InputError(f"{col}: column type {c.type} is not an integer type")
            out[col] = _narrow(c.to_numpy(), np.int32, col, row0)
    binary = "experts" in tab.column_names and pa.types.is_fixed_size_binary(
        tab.schema.field("experts").type)
    if "experts" in tab.column_names:
        raw = (_binary_values(tab.column("experts"), L * k, "experts", row0, stored_dtype(meta))
               if binary else
               _list_values(tab.column("experts"), L * k, "experts", row0, None)).reshape(-1, L, k)
        if not np.issubdtype(raw.dtype, np.integer):
            raise InputError(f"experts: values of type {raw.dtype} are not integers")
        # Range check before narrowing to the in-memory dtype (which would wrap ids): min / max
        # are one pass each over the raw ids; the mask is built only to name a bad id.
        if raw.size and (raw.min() < 0 or raw.max() >= meta.num_experts):
            bad = (raw < 0) | (raw >= meta.num_experts)
            r, l, s = (int(i) for i in np.argwhere(bad)[0])
            raise InputError(f"experts: row {row0 + r} layer {l} slot {s}: expert id "
                             f"{int(raw[r, l, s])} out of range [0, {meta.num_experts})")
        out["experts"] = raw.astype(meta.expert_dtype, copy=False)
    if "weights" in tab.column_names:
        read = _binary_values if pa.types.is_fixed_size_binary(
            tab.schema.field("weights").type) else _list_values
        out["weights"] = read(tab.column("weights"), L * k, "weights", row0,
                              WEIGHT_DTYPE).reshape(-1, L, k)
    if "domain" in tab.column_names:
        out["domain"] = _domain_codes(tab.column("domain"), domains, row0)
    if "decode" in tab.column_names:          # prefill / decode rows (optional, bool)
        c = tab.column("decode")
        if not pa.types.is_boolean(c.type):
            raise InputError(f"decode: column type {c.type} is not bool")
        if c.null_count:
            r = int(np.argmax(c.is_null().to_numpy(zero_copy_only=False)))
            raise InputError(f"decode: row {row0 + r}: value is null")
        out["decode"] = c.to_numpy(zero_copy_only=False).astype(np.bool_, copy=False)
    return out


def _domain_codes(col: pa.ChunkedArray, domains: list[str], row0: int) -> np.ndarray:
    """Map a (dictionary or plain) string column onto int16 indices of `domains`, -1 for null."""
    arr = col.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        local = arr.dictionary.to_pylist()
        lookup = np.array([domains.index(n) if n in domains else -2 for n in local] + [-1], np.int16)
        idx = arr.indices.to_numpy(zero_copy_only=False)
        idx = np.where(arr.is_null().to_numpy(zero_copy_only=False), len(local), idx).astype(np.int64)
        codes = lookup[idx]
    else:
        names = arr.to_pylist()
        codes = np.array([-1 if n is None else (domains.index(n) if n in domains else -2)
                          for n in names], np.int16)
    bad = codes == -2
    if bad.any():
        r = int(np.argmax(bad))
        raise InputError(f"domain: row {row0 + r}: {arr[r].as_py()!r} is not listed in "
                         f"metadata.domains {domains}")
    return codes.astype(np.int16, copy=False)


def arrow_schema(meta: TraceMeta, has_domain: bool, has_weights: bool,
                 format_version: int = FORMAT_VERSION, has_decode: bool = False) -> pa.Schema:
    width = meta.num_layers * meta.top_k
    if format_version == 1:
        expert_type = pa.list_(pa.int16() if meta.stored_dtype == np.int16 else pa.int32(), width)
        weight_type = pa.list_(pa.float32(), width)
    else:
        expert_type = pa.binary(width * stored_dtype(meta).itemsize)
        weight_type = pa.binary(width * WEIGHT_DTYPE.itemsize)
    fields = [pa.field("token_id", pa.int32(), nullable=False),
              pa.field("request_id", pa.int32(), nullable=False),
              pa.field("position", pa.int32(), nullable=False)]
    if has_domain:
        fields.append(pa.field("domain", pa.dictionary(pa.int16(), pa.string())))
    fields.append(pa.field("experts", expert_type, nullable=False))
    if has_weights:
        fields.append(pa.field("weights", weight_type, nullable=False))
    if has_decode:              # prefill (false) / decode (true) rows, when the source knew
        fields.append(pa.field("decode", pa.bool_(), nullable=False))
    return pa.schema(fields)
