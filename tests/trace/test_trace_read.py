"""The fast trace read: the sorting network behind the top-k checks, column selection, and a
multi-row-group read into preallocated arrays (the read figures are in
benchmarks/bench_placement_scale.py)."""

from __future__ import annotations

import itertools
import mmap

import numpy as np
import pytest

from conftest import build_trace, write_unchecked
from sempar.errors import InputError
from sempar.trace import read_trace, write_trace
from sempar.trace.io import iter_blocks
from sempar.trace.validate import sort_network, sorted_slots


@pytest.mark.parametrize("n", range(1, 13))
def test_sort_network_sorts_every_01_input(n):
    # 0-1 principle (Knuth 5.3.4, Theorem Z): a network that sorts all 2^n 0/1 inputs sorts all.
    cols = [c.copy() for c in np.array(list(itertools.product([0, 1], repeat=n)), np.int8).T]
    for i, j in sort_network(n):
        assert i < j
        low = np.minimum(cols[i], cols[j])
        cols[j] = np.maximum(cols[i], cols[j])
        cols[i] = low
    out = np.stack(cols, axis=1)
    assert (np.diff(out, axis=1) >= 0).all()


@pytest.mark.parametrize("k", [1, 2, 3, 8, 9, 40])
def test_sorted_slots_match_np_sort(k):
    e = np.random.default_rng(k).integers(0, 300, (500, 4, k)).astype(np.int16)
    want = np.sort(e, axis=2)
    got = sorted_slots(e)
    assert len(got) == k
    for c in range(k):
        assert np.array_equal(got[c], want[:, :, c])


@pytest.mark.parametrize("slot_a, slot_b", [(0, 7), (3, 4), (6, 7), (0, 1)])
def test_duplicate_found_in_any_slot_pair_k8(slot_a, slot_b):
    t = build_trace(T=40, R=4, N=64, k=8, weights=False)
    t.experts[29, 1, slot_b] = t.experts[29, 1, slot_a]
    with pytest.raises(InputError, match=r"^experts: row 29 layer 1: duplicate expert in top-k "):
        t.validate()


def test_group_limit_counted_over_row_chunks():
    # Rows past the first check chunk (8192 rows) are checked and named in file coordinates.
    t = build_trace(T=9000, R=9, N=16, k=4, groups=(8, 2), weights=False)
    t.experts[8500, 2] = [0, 2, 4, 6]
    with pytest.raises(InputError, match=r"^experts: row 8500 layer 2: top-k \[0, 2, 4, 6\] spans "
                                         r"4 expert groups, more than metadata.topk_groups 2$"):
        t.validate()


def test_read_many_row_groups_round_trip(tmp_path):
    t = build_trace(T=400, R=40)
    p = write_unchecked(t, tmp_path / "t.parquet", row_group_size=16)
    r = read_trace(p)
    for name in ("token_id", "request_id", "position", "experts", "domain", "weights"):
        assert np.array_equal(getattr(r, name), getattr(t, name)), name
    # copied out of the row groups into one array of its own, not a view of an Arrow buffer
    root = r.experts
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    root = root.obj if isinstance(root, memoryview) else root
    assert r.experts.flags["C_CONTIGUOUS"] and isinstance(root, (np.ndarray, mmap.mmap))


def test_read_skips_unrequested_columns(tmp_path):
    t = build_trace()
    p = tmp_path / "t.parquet"
    write_trace(t, p)
    r = read_trace(p, optional=())
    assert r.weights is None and r.domain is None
    assert np.array_equal(r.experts, t.experts)
    r = read_trace(p, optional=("domain",))
    assert r.weights is None and np.array_equal(r.domain, t.domain)
    blocks = list(iter_blocks(p, optional=("weights",)))
    assert all("domain" not in a and "weights" in a for *_, a in blocks)
    with pytest.raises(ValueError):
        read_trace(p, optional=("experts",))


def test_skipped_columns_still_validate_what_is_read(tmp_path):
    t = build_trace()
    t.experts[37, 1, 0] = 9
    p = write_unchecked(t, tmp_path / "bad.parquet")
    with pytest.raises(InputError, match=r"^experts: row 37 layer 1 slot 0: expert id 9 out of "):
        read_trace(p, optional=())
