"""The build's memory savings keep the stats exact (issue 46, item 5): token tables counted as
int32 in memory widen to int64 before any sum could pass int32 (`sketch.count_dtype`); the
file written from int32 tables is the file written from int64 ones, byte for byte, and loads
as int32 (a forged count past int32 is refused, not wrapped); a shard's
tables handed over as a file (`stats.spill`) read back equal and leave no file behind; the
local runner with workers builds the stats the serial one builds."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse

from conftest import build_trace
from sempar.stats.file import load_stats, save_stats
from sempar.stats.routing_stats import PARTS
from sempar.stats.sketch import INT32_ROWS, add_reduce, count_dtype
from sempar.stats.spill import spill_tables
from test_routing_stats_merge import assert_same, stats_of, three_shards


def test_counts_are_int32_until_the_rows_could_pass_it():
    assert count_dtype(INT32_ROWS) == np.int32 and count_dtype(INT32_ROWS + 1) == np.int64
    big = 2**31 - 10                                     # two int32 cells whose sum does not fit
    a = sparse.csr_matrix(np.array([[big, 0], [0, 3]], np.int32))
    b = sparse.csr_matrix(np.array([[big, 1], [0, 0]], np.int32))
    s, t = add_reduce(a, b, 0, count_dtype(2 * big))
    assert t == 0 and s.dtype == np.int64 and s[0, 0] == 2 * big and s[0, 1] == 1
    s, _ = add_reduce(a, b, 1, count_dtype(2 * big))     # reduced: the cap's t subtracted, exact
    assert s.nnz == 1 and s[0, 0] == 2 * big - 3


def test_int32_tables_write_the_int64_tables_file(tmp_path):
    s = stats_of(build_trace(T=240, R=24, L=4), parts=PARTS, sample_rows=60)
    assert all(t.dtype == np.int32 for t in s.tokens)
    wide = stats_of(build_trace(T=240, R=24, L=4), parts=PARTS, sample_rows=60)
    wide.tokens = [t.astype(np.int64) for t in wide.tokens]
    save_stats(s, tmp_path / "a.stats")
    save_stats(wide, tmp_path / "b.stats")
    assert (tmp_path / "a.stats").read_bytes() == (tmp_path / "b.stats").read_bytes()
    back = load_stats(tmp_path / "a.stats")           # int64 in the file, int32 once loaded
    assert all(t.dtype == np.int32 for t in back.tokens)
    assert_same(back, s)


def test_a_count_past_int32_in_a_file_is_not_wrapped_but_refused(tmp_path):
    from test_stats_checks import forge, read_raw

    s = stats_of(build_trace(T=240, R=24, L=4), parts=PARTS, sample_rows=60)
    save_stats(s, tmp_path / "a.stats")
    header, arrays = read_raw(tmp_path / "a.stats")
    data = arrays["tokens.data"].copy()
    data[0] += 2**32                    # would read as the same count if cast to int32
    arrays["tokens.data"] = data
    forge(header, arrays, tmp_path / "b.stats")
    with pytest.raises(Exception, match="above its token's occurrences"):
        load_stats(tmp_path / "b.stats")


def test_spilled_tables_read_back_equal_and_leave_no_file(tmp_path):
    s = stats_of(build_trace(T=240, R=24, L=4), parts=("tokens",), sample_rows=60)
    want = [t.copy() for t in s.tokens]
    path = tmp_path / "x.tokens"
    spilled = spill_tables(s.tokens, str(path))
    assert all(t is None for t in s.tokens) and len(spilled) == len(want)
    assert (spilled[2] != want[2]).nnz == 0 and spilled[2].has_canonical_format
    assert not path.exists()                                  # unlinked once opened
    for l in range(len(want)):
        assert (spilled[l] != want[l]).nnz == 0
        spilled[l] = None
    assert spilled._fd is None                                # closed with its last layer
    never = spill_tables([t.copy() for t in want], str(tmp_path / "y.tokens"))
    never.close()
    assert not (tmp_path / "y.tokens").exists()


@pytest.mark.parametrize("cap", [0, 40])
def test_local_workers_build_the_serial_stats_and_clean_up(tmp_path, monkeypatch, cap):
    import tempfile

    from sempar.stats.run import StatsSettings, build_stats

    paths = three_shards(tmp_path)
    spill = tmp_path / "tmp"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))
    settings_ = StatsSettings(parts=PARTS, sample_rows=150, token_cells=cap)
    serial = build_stats(paths, settings_)
    forked = build_stats(paths, settings_, jobs=2)
    assert isinstance(forked.tokens, list)
    assert_same(forked, serial)
    assert not any(spill.iterdir())                          # the spilled shards are gone
