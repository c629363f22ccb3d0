"""Parquet I/O for `RoutingTrace`: one row per token, compressed, with a JSON metadata block.

Columns (format 3, written by default; format 2 is the same without the checksum):
    token_id   int32
    request_id int32
    position   int32
    domain     dictionary<int16, string>, null = unknown (absent when no row has a domain)
    experts    fixed_size_binary[L * k * b]   L * k little-endian ids of b bytes (b = 2: int16,
                                              4: int32 when num_experts > 32767, as
                                              TraceMeta.stored_dtype), layer-major: layer 0's
                                              k slots first
    weights    fixed_size_binary[L * k * 4]   optional: L * k little-endian float32, same order

Format 1 (still read; written with `format_version=1`) stores `experts` as
fixed_size_list<int16 or int32>[L * k] and `weights` as fixed_size_list<float32>[L * k] (a
variable-size list with exactly L * k values per row is accepted too). The binary rows of
format 2 decode as one buffer per column chunk, viewed by numpy; Parquet assembles a
fixed-size list value by value (about 10x slower for DeepSeek-V3's 464 ids per row).

Key-value metadata `sempar.trace` (trace/footer.py) holds JSON: `format_version`, `meta` (TraceMeta), `domains`,
`num_tokens`, `num_requests`; `sempar.trace.sha256` holds "sha256:" + the hex SHA-256 of that
block's bytes, verified on read (required from format 3; files of formats 1 and 2, written
before it, are read without one, and their metadata is still checked against the rows: every
expert id below num_experts, top-k distinct, row count, request count). The block is parsed
with `safe_json` (size and nesting checked first). Every data page carries a CRC-32 checksum
(Parquet page header `crc`), verified on read. Writes stream row group by row group into a temporary file that is
renamed onto the target only when complete, so no partial trace is ever left behind. Reading
validates every row group and reports the first bad row in file coordinates.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sempar.atomic import atomic_path, check_input
from sempar.errors import InputError
from sempar.trace.columns import (WEIGHT_DTYPE, arrow_schema, block_arrays, check_row_type,
                                  stored_dtype)
from sempar.trace.footer import META_KEY, SUM_KEY, block_checksum, parse_block
from sempar.trace.schema import FORMAT_VERSION, SUPPORTED_VERSIONS, RoutingTrace, TraceMeta
from sempar.trace.validate import check_decode, validate_arrays

# zstd level 1 compresses expert ids about 3x at several hundred MB/s: the 2M-token
# deepseek-v3 synth benchmark is bound by this step.
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1


class TraceWriter:
    """Stream a trace to Parquet block by block; atomic (temp file renamed on `close`).

    Use as a context manager; an exception inside the block removes the temporary file::

        with TraceWriter(path, meta, domains=["code"], has_weights=False) as w:
            w.write(token_id, request_id, position, experts, domain=dom)
    """

    def __init__(self, path: str | os.PathLike, meta: TraceMeta, domains: list[str] | None = None,
                 has_weights: bool = False, validate: bool = True,
                 format_version: int = FORMAT_VERSION, has_decode: bool = False):
        if format_version not in SUPPORTED_VERSIONS:
            raise ValueError(f"format_version: {format_version} is not one of {SUPPORTED_VERSIONS}")
        self.version = format_version
        self.path = Path(path)
        self.meta = meta
        self.domains = list(domains or [])
        self.has_domain = bool(self.domains)
        self.has_weights = has_weights
        self.validate = validate
        self.has_decode = has_decode
        self.schema = arrow_schema(meta, self.has_domain, has_weights, format_version, has_decode)
        self.rows = 0
        self._requests: set[int] | None = set()
        self._request_count = 0
        self._ctx = None
        self._writer: pq.ParquetWriter | None = None
        self._sink: pa.NativeFile | None = None

    def __enter__(self) -> "TraceWriter":
        self._ctx = atomic_path(self.path, suffix=".parquet")
        tmp = self._ctx.__enter__()
        # An opened file, not a str path: pyarrow encodes str paths as UTF-8 and cannot name a
        # file whose name the OS gave as bytes (os.fsencode keeps those bytes as they were).
        self._sink = pa.OSFile(os.fsencode(tmp), "wb")
        self._writer = pq.ParquetWriter(self._sink, self.schema, compression=COMPRESSION,
                                        compression_level=COMPRESSION_LEVEL,
                                        use_dictionary=["domain"] if self.has_domain else False,
                                        write_page_checksum=True,
                                        write_statistics=["token_id", "request_id", "position"])
        return self

    def write(self, token_id: np.ndarray, request_id: np.ndarray, position: np.ndarray,
              experts: np.ndarray, domain: np.ndarray | None = None,
              weights: np.ndarray | None = None, decode: np.ndarray | None = None) -> None:
        """Append rows. Shapes as in `RoutingTrace`; `domain` int16[T] indexes `domains`;
        `decode` bool[T] (given exactly when the writer was made `has_decode`)."""
        assert self._writer is not None, "use TraceWriter as a context manager"
        if self.validate:
            validate_arrays(self.meta, token_id, request_id, position, experts, domain,
                            self.domains, weights, row_offset=self.rows)
        if self.has_weights != (weights is not None):
            raise InputError("weights: given for some blocks of the trace but not for others")
        if self.has_decode != (decode is not None):
            raise InputError("decode: given for some blocks of the trace but not for others")
        if decode is not None:
            check_decode(decode, token_id.shape[0])
        T = token_id.shape[0]
        width = self.meta.num_layers * self.meta.top_k
        cols: list[pa.Array] = [pa.array(token_id.astype(np.int32, copy=False)),
                                pa.array(request_id.astype(np.int32, copy=False)),
                                pa.array(position.astype(np.int32, copy=False))]
        if self.has_domain:
            idx = np.full(T, -1, np.int16) if domain is None else domain.astype(np.int16, copy=False)
            cols.append(pa.DictionaryArray.from_arrays(
                pa.array(idx, mask=idx < 0), pa.array(self.domains, pa.string())))
        cols.append(self._rows(experts, stored_dtype(self.meta), width))
        if weights is not None:
            cols.append(self._rows(weights, WEIGHT_DTYPE, width))
        if decode is not None:
            cols.append(pa.array(decode, pa.bool_()))
        try:
            self._writer.write_table(pa.Table.from_arrays(cols, schema=self.schema))
        except (OSError, pa.ArrowException) as err:
            raise self._named(err) from None
        self.rows += T
        # Counting requests exactly needs their ids; blocks from generators and recorders
        # hold whole requests in order, so a set of the ids seen stays small enough.
        self._requests.update(np.unique(request_id).tolist())

    def _rows(self, values: np.ndarray, dtype: np.dtype, width: int) -> pa.Array:
        """values [T, L, k] as one column: `width` values of `dtype` per row (format 2: the
        rows' bytes, one buffer; format 1: a fixed-size list)."""
        flat = np.ascontiguousarray(values, dtype=dtype).reshape(-1)
        if self.version == 1:
            return pa.FixedSizeListArray.from_arrays(pa.array(flat), width)
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width * dtype.itemsize),
                                                    flat.size // width,
                                                    [None, pa.py_buffer(flat)])

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._writer is not None and self._ctx is not None
        try:
            if exc_type is None and self.rows == 0:
                raise InputError(f"{self.path}: no tokens to write; an empty trace is refused")
            if exc_type is None:
                block = json.dumps(self._meta_block()).encode()
                self._writer.add_key_value_metadata({META_KEY: block,
                                                     SUM_KEY: block_checksum(block)})
            try:
                self._writer.close()
                self._sink.close()
            except (OSError, pa.ArrowException) as err:
                raise self._named(err) from None
        except BaseException as err:
            # The writer is finished here, and marked closed even if finishing fails (a full
            # disk): otherwise its __del__ retries on the closed sink and prints a traceback
            # after our one-line error.
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer.is_open = False
            self._sink.close()
            self._ctx.__exit__(type(err), err, err.__traceback__)
            raise
        self._ctx.__exit__(exc_type, exc, tb)

    def _named(self, err: BaseException) -> OSError:
        """pyarrow's I/O error with the file it was writing named (its own message names none:
        "Error writing bytes to file. Detail: [errno 28] No space left on device")."""
        import errno as errnos
        import re

        code = getattr(err, "errno", None)
        if code is None:
            m = re.search(r"\[errno (\d+)\]", str(err), re.IGNORECASE)
            code = int(m.group(1)) if m else None
        what = os.strerror(code) if code else " ".join(str(err).split())[:200]
        out = OSError(code or errnos.EIO, f"cannot write the trace ({what})")
        out.filename = str(self.path)
        return out

    def _meta_block(self) -> dict[str, Any]:
        return {"format_version": self.version, "meta": self.meta.to_json(),
                "domains": self.domains, "num_tokens": self.rows,
                "num_requests": len(self._requests)}


def write_trace(trace: RoutingTrace, path: str | os.PathLike, row_group_size: int = 65536,
                format_version: int = FORMAT_VERSION) -> None:
    """Validate and write a whole trace atomically."""
    trace.validate()
    with TraceWriter(path, trace.meta, trace.domains if trace.domain is not None else None,
                     has_weights=trace.weights is not None, validate=False,
                     format_version=format_version, has_decode=trace.decode is not None) as w:
        for lo in range(0, max(trace.num_tokens, 1), row_group_size):
            sl = slice(lo, lo + row_group_size)
            w.write(trace.token_id[sl], trace.request_id[sl], trace.position[sl], trace.experts[sl],
                    None if trace.domain is None else trace.domain[sl],
                    None if trace.weights is None else trace.weights[sl],
                    None if trace.decode is None else trace.decode[sl])


def _open(path: str | os.PathLike) -> pq.ParquetFile:
    p = check_input(path, "trace file")
    try:
        # Page CRCs are verified when present (every trace sempar writes has them): a flipped
        # bit in a page is an error, not silently changed expert ids.
        # Opened by bytes path (os.fsencode): pyarrow's own str-path opening fails on file names
        # that are not UTF-8 (`$'\\xff.parquet'`).
        return pq.ParquetFile(pa.OSFile(os.fsencode(p)), page_checksum_verification=True)
    except (pa.ArrowException, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"{p}: not a readable Parquet trace (truncated or another format: {reason})") from None


def read_header(path: str | os.PathLike) -> tuple[pq.ParquetFile, dict[str, Any], TraceMeta]:
    """Open a trace file and check its metadata block against its schema and row count."""
    pf = _open(path)
    kv = pf.metadata.metadata or {}
    if META_KEY not in kv:
        raise InputError(f"{path}: Parquet file has no '{META_KEY.decode()}' metadata block: "
                         "not a sempar trace")
    raw = kv[META_KEY]
    block, version, meta = parse_block(raw, kv.get(SUM_KEY))
    names = pf.schema_arrow.names
    for col in ("token_id", "request_id", "position", "experts"):
        if col not in names:
            raise InputError(f"{col}: column missing from the file")
    n_rows = pf.metadata.num_rows
    if n_rows == 0:
        raise InputError(f"{path}: the trace holds no tokens")
    if block.get("num_tokens") != n_rows:
        raise InputError(f"metadata.num_tokens: {block.get('num_tokens')!r} but the file holds "
                         f"{n_rows} rows")
    for col, dtype in (("experts", stored_dtype(meta)), ("weights", WEIGHT_DTYPE)):
        if col in names:
            check_row_type(col, pf.schema_arrow.field(col).type, meta, dtype, version)
    domains = block.get("domains", [])
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        raise InputError(f"metadata.domains: {domains!r} is not a list of names")
    if "domain" in names and not domains:
        raise InputError("metadata.domains: empty, but the file has a domain column")
    return pf, block, meta


# Columns every reader needs (RoutingTrace's required arrays); `domain` and `weights` are
# read only when asked for.
REQUIRED_COLUMNS = ("token_id", "request_id", "position", "experts")
OPTIONAL_COLUMNS = ("domain", "weights", "decode")


def _columns(pf: pq.ParquetFile, optional: tuple[str, ...] | None) -> list[str]:
    """The file's columns to read: the required ones plus those of `optional` it has (None:
    all it has)."""
    unknown = set(optional or ()) - set(OPTIONAL_COLUMNS)
    if unknown:
        raise ValueError(f"optional columns: {sorted(unknown)} are not among {OPTIONAL_COLUMNS}")
    names = pf.schema_arrow.names
    return list(REQUIRED_COLUMNS) + [c for c in OPTIONAL_COLUMNS if c in names
                                     and (optional is None or c in optional)]


def iter_blocks(path: str | os.PathLike, optional: tuple[str, ...] | None = None,
                validate: bool = True) -> Iterator[tuple[TraceMeta, list[str], int, dict[str, np.ndarray]]]:
    """Yield (meta, domains, first_row, arrays) per Parquet row group, validated.

    Reads the required columns and those of `optional` (`domain`, `weights`) the file has;
    None reads every column. The arrays may be views of the row group's Arrow buffers."""
    pf, block, meta = read_header(path)
    domains = list(block.get("domains", []))
    columns = _columns(pf, optional)
    row0 = 0
    for g in range(pf.metadata.num_row_groups):
        try:
            tab = pf.read_row_group(g, columns=columns)
        except (pa.ArrowException, OSError) as err:
            raise InputError(f"{path}: row group {g} cannot be read (corrupted or truncated: "
                             f"{str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
        arrays = block_arrays(tab, meta, domains, row0)
        if validate:
            validate_arrays(meta, arrays["token_id"], arrays["request_id"], arrays["position"],
                            arrays["experts"], arrays.get("domain"), domains, arrays.get("weights"),
                            row_offset=row0)
        yield meta, domains, row0, arrays
        row0 += tab.num_rows


def _small_pages(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array of `shape` and `dtype` in its own anonymous mapping, without the
    MADV_HUGEPAGE advice numpy gives large allocations.

    Why: with transparent huge pages on `madvise` (a common default) a first touch of an advised
    region may compact memory to build 2 MB pages, and filling a trace once gains nothing from
    them. Reading the 2M-token DeepSeek-V3-shaped trace (0.93 GB of ids) here took 18.7-21.5 s
    with numpy's allocation (9.3-12.6 s of it in the kernel) and 5.9-6.8 s with this one, the
    same 4.4 s of user time (`benchmarks/bench_placement_scale.py`, rows `read`)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if count * dtype.itemsize == 0:
        return np.empty(shape, dtype)
    buf = mmap.mmap(-1, count * dtype.itemsize)   # the array's base keeps the mapping alive
    return np.frombuffer(buf, dtype, count).reshape(shape)


def read_trace(path: str | os.PathLike, validate: bool = True,
               optional: tuple[str, ...] | None = None) -> RoutingTrace:
    """Read and validate a whole trace file into memory.

    `optional`: which of `domain`, `weights` to read (None: both, when present); a verb that
    does not use the router weights skips them (for a recorded trace they are twice the size
    of the expert ids). Row groups are copied one at a time into arrays sized from the file's
    row count, so the peak is the trace plus one row group, not twice the trace. Expert ids come
    back as `meta.expert_dtype` (uint8 up to 256 experts); an id out of range raises even with
    `validate=False`, since narrowing it would wrap it onto a valid id."""
    pf, block, meta = read_header(path)
    n = pf.metadata.num_rows
    out: dict[str, np.ndarray] = {}
    domains: list[str] = []
    filled = 0
    for meta, domains, row0, arrays in iter_blocks(path, optional, validate=validate):
        rows = arrays["token_id"].shape[0]
        if row0 + rows > n:
            raise InputError(f"{path}: row groups hold more rows than the footer's {n}")
        for key, a in arrays.items():
            if key not in out:
                out[key] = _small_pages((n,) + a.shape[1:], a.dtype)
            out[key][row0:row0 + rows] = a
        filled = row0 + rows
    if filled != n:
        raise InputError(f"{path}: row groups hold {filled} rows but the footer says {n}")

    trace = RoutingTrace(meta=meta, token_id=out["token_id"], request_id=out["request_id"],
                         position=out["position"], experts=out["experts"],
                         domain=out.get("domain"), domains=domains, weights=out.get("weights"),
                         decode=out.get("decode"))
    if validate and block.get("num_requests") not in (None, trace.num_requests):
        raise InputError(f"metadata.num_requests: {block.get('num_requests')!r} but the file holds "
                         f"{trace.num_requests} distinct request ids")
    return trace


def trace_info(path: str | os.PathLike) -> dict[str, Any]:
    """The `trace info --json` contract, streaming block by block (validates every row)."""
    tokens = 0
    requests: set[int] = set()
    counts: dict[str, int] = {}
    meta = None
    has_weights = False
    for meta, domains, _, arrays in iter_blocks(path):
        tokens += arrays["token_id"].shape[0]
        requests.update(np.unique(arrays["request_id"]).tolist())
        has_weights = "weights" in arrays
        if "domain" in arrays:
            c = np.bincount(arrays["domain"][arrays["domain"] >= 0], minlength=len(domains))
            for name, n in zip(domains, c):
                counts[name] = counts.get(name, 0) + int(n)
    _, block, meta = read_header(path)
    if block.get("num_requests") not in (None, len(requests)):
        raise InputError(f"metadata.num_requests: {block.get('num_requests')!r} but the file holds "
                         f"{len(requests)} distinct request ids")
    return {"tokens": tokens, "requests": len(requests), "layers": meta.num_layers,
            "experts": meta.num_experts, "top_k": meta.top_k, "domains": counts,
            "model": meta.model, "shared_experts": meta.shared_experts,
            "vocab_size": meta.vocab_size, "has_weights": has_weights,
            "has_token_ids": meta.has_token_ids, "slots_sorted": meta.slots_sorted}

