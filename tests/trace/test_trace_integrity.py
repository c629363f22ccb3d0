"""Trace integrity: every data page carries a CRC-32 that the reader verifies, so a flipped bit
inside a trace is refused (one line) instead of silently changing expert ids. Without page
checksums about 70 % of single-bit flips in the page region read back as valid, changed data."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import build_trace
from sempar.errors import InputError
from sempar.trace import read_trace, write_trace


def test_pages_carry_checksums(tmp_path):
    p = tmp_path / "t.parquet"
    write_trace(build_trace(T=400, R=20), p)
    # a reader that verifies finds them; pyarrow only verifies pages that have a crc
    pq.ParquetFile(p, page_checksum_verification=True).read()


def test_single_bit_flips_in_pages_are_refused(tmp_path):
    t = build_trace(T=2000, R=20, L=4, N=64, k=4)
    p = tmp_path / "t.parquet"
    write_trace(t, p)
    raw = bytearray(p.read_bytes())
    footer = struct.unpack("<i", raw[-8:-4])[0]
    pages_end = len(raw) - 8 - footer
    rng = np.random.default_rng(0)
    silent = 0
    flips = rng.choice(np.arange(4, pages_end), 120, replace=False)
    for pos in flips:
        bad = bytearray(raw)
        bad[pos] ^= 1 << int(rng.integers(8))
        q = tmp_path / "flipped.parquet"
        q.write_bytes(bytes(bad))
        try:
            r = read_trace(q)
        except InputError as e:
            assert "\n" not in str(e)
            continue
        changed = not (np.array_equal(r.experts, t.experts) and np.array_equal(r.weights, t.weights)
                       and np.array_equal(r.token_id, t.token_id)
                       and np.array_equal(r.request_id, t.request_id)
                       and np.array_equal(r.position, t.position))
        silent += changed
    assert silent == 0, f"{silent} of {len(flips)} flips changed the data unnoticed"
