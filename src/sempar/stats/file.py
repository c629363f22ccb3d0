"""The `RoutingStats` file: safetensors arrays plus a self-describing, checksummed header.

Format `sempar-routing-stats` version 2 (version 1 files are read too): a safetensors file
(no pickle; its header's offsets
are checked before any array is read) whose metadata entry "sempar" is a JSON object: format,
version, the trace's model metadata (`TraceMeta.to_json`), domains, parts, seed, sample_rows,
shards [[name, rows]], sample_cut, token_cells (version 2: the token tables' cap,
`stats.sketch`; 0 for none) and "sha256": the SHA-256 of the object without that key
(sorted keys, compact) followed by each array's name, dtype, shape and bytes in name order. A
flipped bit anywhere is a one-line refusal. The hash has no key: it detects damage, it is no
signature (whoever edits a file can recompute it), so `load_stats` then checks every part's
contents (`stats.checks`). Arrays:

- `loads` int64[L, N]; `request_ids`, `request_rows` int64[R];
- `sample.<column>` (part "sample"): row int64[S], token_id, request_id, position, experts
  [S, L, k], domain (when the trace has one);
- `tokens.indptr` int64[L, V + 1], `tokens.indices` int32[nnz], `tokens.data` int64[nnz],
  `tokens.offsets` int64[L + 1] (layer l's entries are [offsets[l], offsets[l+1])), and in
  version 2 `tokens.error` int64[L] (each layer's error bound, `stats.sketch`) and
  `tokens.occurrences` int64[V] (each token's occurrences);

Version 1 (before the tables had a cap) is version 2 with token_cells 0, error 0 and the
occurrences read from the exact tables (row sums / k): such files load unchanged, and merge
with files built with `--token-cells 0`.
- `coactivation` int64[L, N, N]; `transitions` int64[L-1, N, N];
- `request_experts.*` as `tokens.*`, rows indexed like `request_ids`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np
from scipy import sparse

from sempar.stats.routing_stats import SAMPLE_COLUMNS, RoutingStats
from sempar.errors import InputError
from sempar.trace.schema import TraceMeta

FORMAT = "sempar-routing-stats"
VERSION = 2
READS = (1, 2)
HEADER_KEY = "sempar"


def _pack_tables(prefix: str, tables: list[sparse.csr_matrix]) -> dict[str, np.ndarray]:
    data = [t.data.astype(np.int64) for t in tables]
    return {f"{prefix}.indptr": np.stack([t.indptr.astype(np.int64) for t in tables]),
            f"{prefix}.indices": np.concatenate([t.indices.astype(np.int32) for t in tables]),
            f"{prefix}.data": np.concatenate(data),
            f"{prefix}.offsets": np.concatenate([[0], np.cumsum([d.size for d in data])]
                                                ).astype(np.int64)}


def _unpack_tables(prefix: str, arrays: dict[str, np.ndarray], layers: int, cols: int,
                   dtype=np.int64) -> list[sparse.csr_matrix]:
    """The L tables of `prefix`, each layer's counts as `dtype` where they fit it (int32 for
    token tables while the rows fit, `sketch.count_dtype`: the build's 8 B a cell instead of
    the file's 12, for the load and all that runs after it; a layer with a count outside
    int32 stays int64 and is refused by the checks, no count of a valid file being above
    its rows)."""
    indptr, off = arrays[f"{prefix}.indptr"], arrays[f"{prefix}.offsets"]
    ind, data = arrays[f"{prefix}.indices"], arrays[f"{prefix}.data"]
    if indptr.ndim != 2 or indptr.shape[0] != layers or indptr.shape[1] < 1 \
            or ind.ndim != 1 or data.shape != ind.shape:
        raise InputError(f"stats file: {prefix} tables have the wrong shapes")
    if off.ndim != 1 or off.size != indptr.shape[0] + 1 or off[0] != 0 or off[-1] != ind.size \
            or (np.diff(off) < 0).any():
        raise InputError(f"stats file: {prefix} tables are inconsistent")
    out = []
    for l in range(indptr.shape[0]):
        lo, hi = int(off[l]), int(off[l + 1])
        if indptr[l, -1] != hi - lo:
            raise InputError(f"stats file: {prefix} table {l} is inconsistent")
        d = data[lo:hi]
        if d.dtype != dtype and d.size and np.iinfo(dtype).min <= d.min() \
                and d.max() <= np.iinfo(dtype).max:
            d = d.astype(dtype)      # its own array: scipy copies a small view of a big one
        out.append(sparse.csr_matrix((d, ind[lo:hi], indptr[l]),
                                     shape=(indptr.shape[1] - 1, cols)))
    return out


def to_arrays(stats: RoutingStats) -> dict[str, np.ndarray]:
    """The file's arrays (module docstring), contiguous."""
    arrays = {"loads": stats.loads, "request_ids": stats.request_ids,
              "request_rows": stats.request_rows}
    if stats.sample is not None:
        arrays.update({f"sample.{k}": v for k, v in stats.sample.items()})
    if stats.tokens is not None:
        arrays.update(_pack_tables("tokens", stats.tokens))
        arrays.update(_token_extras(stats))
    if stats.coactivation is not None:
        arrays["coactivation"] = stats.coactivation
    if stats.transitions is not None:
        arrays["transitions"] = stats.transitions
    if stats.request_experts is not None:
        arrays.update(_pack_tables("request_experts", stats.request_experts))
    return {k: np.ascontiguousarray(v) for k, v in arrays.items()}


def _token_extras(stats: RoutingStats) -> dict[str, np.ndarray]:
    return {"tokens.error": np.asarray(stats.token_error, np.int64),
            "tokens.occurrences": np.asarray(stats.token_occurrences, np.int64)}


def _header(stats: RoutingStats) -> dict:
    return {"format": FORMAT, "version": VERSION, "meta": stats.meta.to_json(),
            "domains": list(stats.domains), "parts": list(stats.parts), "seed": stats.seed,
            "sample_rows": stats.sample_rows, "shards": [[n, r] for n, r in stats.shards],
            "sample_cut": list(stats.sample_cut) if stats.sample_cut else None,
            "token_cells": int(stats.token_cells)}


def checksum(header: dict, arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 (hex) of the header (without "sha256") and the arrays (module docstring)."""
    h = hashlib.sha256(json.dumps({k: v for k, v in header.items() if k != "sha256"},
                                  sort_keys=True, separators=(",", ":")).encode())
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        h.update(_raw(a))
    return h.hexdigest()


def _raw(a: np.ndarray) -> memoryview | bytes:
    """The array's bytes without a copy (memoryview cannot cast an empty [0, N, N] view)."""
    return memoryview(np.ascontiguousarray(a)).cast("B") if a.size else b""


_ST_DTYPES = {"int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
              "uint16": "U16", "uint32": "U32", "uint64": "U64", "float64": "F64",
              "float32": "F32", "bool": "BOOL"}


def _pieces(stats: RoutingStats) -> dict[str, tuple[np.dtype, tuple, list]]:
    """The file's arrays as (dtype, shape, pieces in order), the token tables' per-layer
    arrays left unconcatenated (`to_arrays`' content without its copies); a piece is an array
    or a function making it (a layer's counts widened to int64 only when written: the tables
    are int32 in memory, `sketch.count_dtype`)."""
    out = {}
    small = to_arrays(dataclasses.replace(stats, tokens=None, request_experts=None))
    for k, v in small.items():
        out[k] = (v.dtype, v.shape, [v])
    for prefix, tables in (("tokens", stats.tokens), ("request_experts", stats.request_experts)):
        if tables is None:
            continue
        if prefix == "tokens":
            for k, v in _token_extras(stats).items():
                out[k] = (v.dtype, v.shape, [v])
        sizes = [t.nnz for t in tables]
        nnz = sum(sizes)
        out[f"{prefix}.data"] = (np.dtype(np.int64), (nnz,), [
            lambda t=t: np.ascontiguousarray(t.data, np.int64) for t in tables])
        out[f"{prefix}.indices"] = (np.dtype(np.int32), (nnz,), [
            lambda t=t: np.ascontiguousarray(t.indices, np.int32) for t in tables])
        out[f"{prefix}.indptr"] = (np.dtype(np.int64), (len(tables), tables[0].shape[0] + 1), [
            lambda t=t: np.ascontiguousarray(t.indptr, np.int64) for t in tables])
        out[f"{prefix}.offsets"] = (np.dtype(np.int64), (len(tables) + 1,), [np.concatenate(
            [[0], np.cumsum(sizes)]).astype(np.int64)])
    return out


def _blob(table: dict, header: dict) -> bytes:
    table = {**table, "__metadata__": {HEADER_KEY: json.dumps(header)}}
    blob = json.dumps(table, separators=(",", ":")).encode()
    return blob + b" " * (-len(blob) % 8)


def save_stats(stats: RoutingStats, path: str | os.PathLike, option: str = "--out") -> None:
    """Write `stats` atomically at `path` (the output rule checked), streamed array by array
    in the safetensors layout (8-byte little-endian header size, JSON header, the arrays'
    bytes in header order): `safetensors.numpy.save_file` builds the whole file in memory
    beside a packed copy of every table (3x the stats at peak: 4.7 GB for the 1.3 GB stats
    of 20M DeepSeek-V3-shape tokens); `load_stats` reads it with safetensors. One pass: the
    arrays are hashed as they are written (a layer at a time, widened to the file's dtypes
    then), and the header, written first with a placeholder hash of the same length, is
    rewritten with the hash at the end."""
    import struct

    from sempar.atomic import atomic_path

    pieces = _pieces(stats)
    header = _header(stats)
    h = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    table, at = {}, 0
    for name in sorted(pieces):
        dtype, shape, _parts = pieces[name]
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        table[name] = {"dtype": _ST_DTYPES[dtype.name], "shape": list(shape),
                       "data_offsets": [at, at + size]}
        at += size
    header["sha256"] = "0" * 64
    blob = _blob(table, header)
    with atomic_path(path, suffix=".safetensors", option=option) as tmp:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for name in sorted(pieces):
                dtype, shape, parts = pieces[name]
                h.update(f"{name}|{dtype.str}|{tuple(shape)}".encode())
                size = 0
                for part in parts:
                    a = part() if callable(part) else part
                    if a.dtype != dtype:
                        raise AssertionError(f"{name}: {a.dtype} written as {dtype}")
                    h.update(_raw(a))
                    f.write(_raw(a))
                    size += a.nbytes
                    del a
                start, end = table[name]["data_offsets"]
                if size != end - start:
                    raise AssertionError(f"{name}: {size} bytes written for {end - start}")
            header["sha256"] = h.hexdigest()
            final = _blob(table, header)
            if len(final) != len(blob):
                raise AssertionError("the stats header changed length with its hash")
            f.seek(8)
            f.write(final)


def load_stats(path: str | os.PathLike) -> RoutingStats:
    """Read and check a stats file; one-line `InputError` on anything wrong."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file, safe_open

    from sempar.native_path import utf8_path
    from sempar.output_rule import check_input
    from sempar.safe_json import parse_json

    p = check_input(path, "stats file")
    try:
        with utf8_path(p) as name:
            with safe_open(name, framework="np") as f:
                raw = (f.metadata() or {}).get(HEADER_KEY)
            arrays = load_file(name) if raw is not None else {}
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"{path}: not a readable stats file ({str(err).splitlines()[0]})") from None
    if raw is None:
        raise InputError(f"{path}: no '{HEADER_KEY}' header: not a sempar stats file")
    header = parse_json(raw, f"{path}: the stats header")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise InputError(f"{path}: not a sempar stats file (format {header.get('format')!r})"
                         if isinstance(header, dict) else f"{path}: the stats header is not an object")
    if header.get("version") not in READS:
        raise InputError(f"{path}: stats format version {header.get('version')!r} is not "
                         f"supported (this sempar reads {', '.join(map(str, READS))})")
    if header.get("sha256") != checksum(header, arrays):
        raise InputError(f"{path}: checksum mismatch: the stats file was changed or is corrupt")
    return _from_parts(header, arrays, path)


def _from_parts(header: dict, arrays: dict[str, np.ndarray], path) -> RoutingStats:
    """The stats of a file whose hash matched, every part checked (`stats.checks`: the hash
    has no key, so a matching one says nothing about who wrote the contents)."""
    from sempar.stats.checks import check_arrays, check_header, check_stats
    from sempar.stats.sketch import count_dtype

    try:
        meta = TraceMeta.from_json(header["meta"])
        check_header(header)
        parts = tuple(header["parts"])
        L, N = meta.num_layers, meta.num_experts
        version = header["version"]
        check_arrays(arrays, list(parts), L, version)
        if arrays["loads"].shape != (L, N):
            raise InputError(f"loads shape {arrays['loads'].shape} is not ({L}, {N})")
        cut = header.get("sample_cut")
        stats = RoutingStats(meta, list(header["domains"]), parts, int(header["seed"]),
                             int(header["sample_rows"]), [(str(n), int(r)) for n, r in header["shards"]],
                             arrays["loads"], arrays["request_ids"], arrays["request_rows"],
                             sample_cut=(int(cut[0]), int(cut[1])) if cut else None,
                             token_cells=header["token_cells"] if version >= 2 else 0)
        if "sample" in parts:
            stats.sample = {c: arrays[f"sample.{c}"] for c in SAMPLE_COLUMNS
                            if f"sample.{c}" in arrays}
        if "tokens" in parts:
            stats.tokens = _unpack_tables("tokens", arrays, L, N, count_dtype(stats.rows))
            if version >= 2:
                stats.token_error = arrays["tokens.error"]
                stats.token_occurrences = arrays["tokens.occurrences"]
            else:                          # exact tables: occurrences are row sums / k
                stats.token_error = np.zeros(L, np.int64)
                stats.token_occurrences = np.asarray(stats.tokens[0].sum(
                    axis=1, dtype=np.int64)).ravel() // meta.top_k
        stats.coactivation = arrays.get("coactivation")
        stats.transitions = arrays.get("transitions")
        if "request-experts" in parts:
            stats.request_experts = _unpack_tables("request_experts", arrays, L, N)
        return check_stats(stats)
    except InputError as err:
        raise InputError(f"{path}: {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"{path}: the stats file misses or mangles {err}") from None
