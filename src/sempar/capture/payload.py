"""The routed-expert payloads SGLang and vLLM return, decoded into arrays (one decoder for
`sempar capture` and `sempar import sglang-routed / vllm-routed`).

- SGLang 0.5.23 (`meta_info["routed_experts"]`): base64 of the raw bytes of an int32 array
  [rows, num_hidden_layers, top_k] (`detokenizer_manager._b64_encode_per_request`: no header,
  native little-endian; the shape is not in the payload, so rows = bytes / (layers x top_k x 4)).
- vLLM 0.33.0 (`choices[i].routed_experts` of the token-in-token-out generate endpoint): base64
  of `.npy` bytes (`utils/serial_utils.numpy2base64`) of a uint8 (<= 256 experts) / uint16 /
  int32 array [rows, num_hidden_layers, top_k].

Both cover sequence positions [start, prompt + output - 1): the last sampled token is never
forwarded. Their layer axis is the model's `num_hidden_layers`, dense layers included (DeepSeek's
first layers: columns that hold no routing), so `moe_columns` keeps the MoE layers the config
names. Ids are logical (captured before any logical-to-physical map); SGLang drops fused
shared-expert columns before returning.

A payload is data, never code: sizes are checked against the row count expected from the token
counts BEFORE base64 is decoded (a hostile server cannot make us allocate more than the expected
array), an `.npy` header is parsed with numpy's literal parser (no pickle; `np.load` is never
called on it) and only plain integer dtypes in C order are accepted.
"""

from __future__ import annotations

import ast
import binascii
from dataclasses import dataclass

import numpy as np

from sempar.errors import InputError

try:                      # SGLang's own base64 codec; the stdlib's decodes the same bytes
    import pybase64 as _b64
except ImportError:       # pragma: no cover - pybase64 is a dependency
    import base64 as _b64

# Largest .npy header numpy writes for a 3-D array is well under 1 KiB; 64 KiB is numpy's own
# limit for reading one safely (np.lib.format._MAX_HEADER_SIZE = 10000 by default).
NPY_HEADER_MAX = 65536
# dtypes a routed-expert array may have: plain integers, either byte order.
NPY_DTYPES = ("|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<i8", "<u8",
              ">u2", ">i2", ">u4", ">i4", ">i8", ">u8")


@dataclass(frozen=True)
class PayloadShape:
    """What a payload row holds: `num_hidden_layers` x `top_k` ids of 0..num_experts-1, of which
    the columns `layer_ids` (ascending model layer numbers) are the MoE layers kept."""

    num_hidden_layers: int
    top_k: int
    num_experts: int
    layer_ids: tuple[int, ...]

    @property
    def row_values(self) -> int:
        return self.num_hidden_layers * self.top_k


def b64_length(nbytes: int) -> int:
    """Characters of the padded base64 of `nbytes` bytes."""
    return 4 * ((nbytes + 2) // 3)


def _b64decode(text: str | bytes, what: str) -> bytes:
    try:
        return _b64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError) as err:
        raise InputError(f"{what}: not base64 ({str(err).splitlines()[0][:80]})") from None


def decode_sglang(text: object, rows: int | None, shape: PayloadShape, what: str,
                  max_rows: int | None = None) -> np.ndarray:
    """SGLang's payload -> int32[rows, num_hidden_layers, top_k] (a view of the decoded bytes).

    rows: the rows expected (known token counts), or None to take them from the size, at most
    `max_rows` (then required)."""
    if not isinstance(text, str):
        raise InputError(f"{what}: routed experts are {type(text).__name__}, not a base64 string")
    per_row = shape.row_values * 4
    limit = rows if rows is not None else max_rows
    assert limit is not None, "decode_sglang needs rows or max_rows"
    if len(text) > b64_length(limit * per_row):
        raise InputError(f"{what}: payload of {len(text)} base64 characters is larger than "
                         f"{limit} rows x {shape.num_hidden_layers} layers x top-{shape.top_k} "
                         f"int32 ({b64_length(limit * per_row)} characters)")
    raw = _b64decode(text, what)
    if len(raw) % per_row:
        raise InputError(f"{what}: payload of {len(raw)} bytes is not a multiple of "
                         f"{shape.num_hidden_layers} layers x top-{shape.top_k} x 4 bytes "
                         "(model shape does not match the server's)")
    n = len(raw) // per_row
    if rows is not None and n != rows:
        raise InputError(f"{what}: payload holds {n} rows, expected {rows} (prompt + output - 1 "
                         "- start)")
    return np.frombuffer(raw, dtype="<i4").reshape(n, shape.num_hidden_layers, shape.top_k)


def _npy_header(raw: bytes, what: str) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, data offset) of `.npy` bytes; only plain integer C-order arrays pass."""
    if len(raw) < 10 or raw[:6] != b"\x93NUMPY":
        raise InputError(f"{what}: not .npy bytes (no \\x93NUMPY magic)")
    major = raw[6]
    if major == 1:
        hlen, start = int.from_bytes(raw[8:10], "little"), 10
    elif major in (2, 3):
        if len(raw) < 12:
            raise InputError(f"{what}: truncated .npy header")
        hlen, start = int.from_bytes(raw[8:12], "little"), 12
    else:
        raise InputError(f"{what}: .npy format version {major} is not one numpy writes")
    if hlen > NPY_HEADER_MAX or start + hlen > len(raw):
        raise InputError(f"{what}: .npy header of {hlen} bytes is truncated or too large")
    try:
        header = ast.literal_eval(raw[start:start + hlen].decode("latin1"))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise InputError(f"{what}: .npy header is not a Python literal") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise InputError(f"{what}: .npy header {str(header)[:80]!r} is not numpy's")
    descr, shp = header["descr"], header["shape"]
    if not isinstance(descr, str) or descr not in NPY_DTYPES:
        raise InputError(f"{what}: .npy dtype {str(descr)[:40]!r} is not a plain integer type "
                         "(routed experts are uint8 / uint16 / int32)")
    if header["fortran_order"] is not False:
        raise InputError(f"{what}: .npy array is in Fortran order; expected C order")
    if not isinstance(shp, tuple) or not all(isinstance(x, int) and x >= 0 for x in shp):
        raise InputError(f"{what}: .npy shape {str(shp)[:40]} is not a tuple of sizes")
    return np.dtype(descr), shp, start + hlen


def decode_npy(text: object, rows: int | None, shape: PayloadShape, what: str,
               max_rows: int | None = None) -> np.ndarray:
    """vLLM's payload -> int[rows, num_hidden_layers, top_k] of its dtype (a view)."""
    if not isinstance(text, str):
        raise InputError(f"{what}: routed experts are {type(text).__name__}, not a base64 string")
    limit = rows if rows is not None else max_rows
    assert limit is not None, "decode_npy needs rows or max_rows"
    most = b64_length(limit * shape.row_values * 8 + NPY_HEADER_MAX + 12)
    if len(text) > most:
        raise InputError(f"{what}: payload of {len(text)} base64 characters is larger than any "
                         f".npy of {limit} rows x {shape.num_hidden_layers} layers x "
                         f"top-{shape.top_k} ({most})")
    raw = _b64decode(text, what)
    dtype, shp, offset = _npy_header(raw, what)
    if len(shp) != 3 or shp[1:] != (shape.num_hidden_layers, shape.top_k):
        raise InputError(f"{what}: .npy shape {shp}, expected (rows, {shape.num_hidden_layers} "
                         f"layers, top-{shape.top_k}) (model shape does not match the server's)")
    if rows is not None and shp[0] != rows:
        raise InputError(f"{what}: payload holds {shp[0]} rows, expected {rows} (prompt + output "
                         "- 1 - start)")
    if shp[0] > limit:
        raise InputError(f"{what}: payload holds {shp[0]} rows, more than {limit}")
    count = shp[0] * shape.row_values
    if len(raw) - offset != count * dtype.itemsize:
        raise InputError(f"{what}: .npy data of {len(raw) - offset} bytes, header says "
                         f"{count} x {dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shp)


def moe_columns(payload: np.ndarray, shape: PayloadShape, out_dtype: np.dtype,
                what: str) -> np.ndarray:
    """payload int[rows, num_hidden_layers, k] -> out_dtype[rows, L, k]: the MoE layers' columns,
    every id checked to lie in 0..num_experts-1 (dense-layer columns are not looked at)."""
    if len(shape.layer_ids) == shape.num_hidden_layers:
        moe = payload
    else:
        moe = payload[:, list(shape.layer_ids), :]
    if moe.size:
        lo, hi = int(moe.min()), int(moe.max())
        if lo < 0 or hi >= shape.num_experts:
            bad = (moe < 0) | (moe >= shape.num_experts)
            r, c, s = (int(i) for i in np.argwhere(bad)[0])
            raise InputError(f"{what}: row {r} layer {shape.layer_ids[c]} slot {s}: expert id "
                             f"{int(moe[r, c, s])} is outside 0..{shape.num_experts - 1}")
    return moe.astype(out_dtype)
