"""The metadata block of a trace file (Parquet key-value metadata, trace/io.py's footer).

`META_KEY` holds JSON: `format_version`, `meta` (TraceMeta), `domains`, `num_tokens`,
`num_requests`; `SUM_KEY` holds "sha256:" + the hex SHA-256 of that block's bytes (required from
format `CHECKSUM_SINCE`). `parse_block` turns the stored bytes into the checked block.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sempar.errors import InputError
from sempar.safe_json import parse_json
from sempar.trace.schema import SUPPORTED_VERSIONS, TraceMeta

META_KEY = b"sempar.trace"
# SHA-256 of the metadata block's bytes (format 3 on): a changed expert count, layer list or
# row count in the footer is refused like a flipped bit in a page. Formats 1 and 2 predate it
# and are read without one; a format-3 file without it is refused.
SUM_KEY = b"sempar.trace.sha256"
CHECKSUM_SINCE = 3
META_BYTES_MAX = 16 << 20       # the block is a few kB; provenance (`extra`) stays small


def block_checksum(block: bytes) -> bytes:
    """The `SUM_KEY` value of a metadata block: "sha256:" + hex digest of its bytes."""
    return b"sha256:" + hashlib.sha256(block).hexdigest().encode()


def check_block_checksum(block: bytes, stored: bytes | None, version: int) -> None:
    """Refuse a metadata block whose checksum does not match, or a format that needs one
    (`CHECKSUM_SINCE` on) without it; older formats without one pass."""
    if stored is None:
        if version >= CHECKSUM_SINCE:
            raise InputError(f"metadata: format {version} carries a '{SUM_KEY.decode()}' checksum "
                             "of its metadata block, and this file has none (edited by hand?)")
        return
    if stored != block_checksum(block):
        raise InputError("metadata: the metadata block does not match its checksum "
                         f"'{SUM_KEY.decode()}' (changed after it was written)")


def parse_block(raw: bytes, stored_sum: bytes | None) -> tuple[dict[str, Any], int, TraceMeta]:
    """The metadata block `raw` (bytes of `META_KEY`) -> (block dict, format version, meta),
    checked: JSON object within `META_BYTES_MAX`, a supported version, its checksum, a meta
    object. Raises InputError naming the first fault."""
    try:
        block = parse_json(raw, f"metadata: the '{META_KEY.decode()}' block",
                           max_bytes=META_BYTES_MAX)
    except InputError as err:
        if "not JSON" in str(err) or "not UTF-8" in str(err):
            raise InputError(f"metadata: the '{META_KEY.decode()}' block is not valid JSON") from None
        raise
    if not isinstance(block, dict):
        raise InputError("metadata: the metadata block is not a JSON object")
    version = block.get("format_version")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise InputError(f"metadata.format_version: {version!r} is not supported "
                         f"(this sempar reads {', '.join(map(str, SUPPORTED_VERSIONS))})")
    check_block_checksum(raw, stored_sum, version)
    if not isinstance(block.get("meta"), dict):
        raise InputError("metadata.meta: missing or not an object")
    try:
        meta = TraceMeta.from_json(block["meta"])
    except TypeError as err:
        raise InputError(f"metadata.meta: {err}") from None
    return block, version, meta
