"""Capped token tables (stats/sketch.py): a Misra-Gries summary per layer whose counts read low
by at most the stored error, the error within k x rows / (cap + 1), through chunked builds and
merges in any order; exact (error 0) while the cap is not reached; the cap travels in the file
(version 2), version 1 files still load, and stats of different caps do not merge."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from scipy import sparse

from conftest import build_trace, run_cli
from sempar.errors import InputError
from sempar.stats.build import StatsBuilder
from sempar.stats.file import _header, load_stats, save_stats, to_arrays
from sempar.trace.io import write_trace
from test_stats_checks import forge
from sempar.stats.routing_stats import merge, merge_all
from sempar.stats.sketch import bound, reduce_table
from test_routing_stats_merge import assert_same, stats_of, uneven_trace


def capped(trace, cap, chunk_ids=40, block=7):
    b = StatsBuilder(trace.meta, trace.domains, ("sample", "tokens"), 0, 60, "t",
                     chunk_ids=chunk_ids, token_cells=cap)
    for lo in range(0, trace.num_tokens, block):
        sl = slice(lo, lo + block)
        b.add({"token_id": trace.token_id[sl], "request_id": trace.request_id[sl],
               "position": trace.position[sl], "experts": trace.experts[sl], "domain": None})
    return b.finish()


def exact_table(trace, l):
    V, N, k = trace.meta.vocab_size, trace.meta.num_experts, trace.meta.top_k
    ref = sparse.csr_matrix((np.ones(trace.num_tokens * k, np.int64),
                             (np.repeat(trace.token_id, k), trace.experts[:, l].ravel())),
                            shape=(V, N))
    ref.sum_duplicates()
    return ref


def assert_within_bound(stats, trace, cap):
    k = trace.meta.top_k
    assert np.array_equal(stats.token_occurrences,
                          np.bincount(trace.token_id, minlength=trace.meta.vocab_size))
    for l, t in enumerate(stats.tokens):
        err = int(stats.token_error[l])
        assert t.nnz <= cap and 0 <= err <= bound(cap, k, trace.num_tokens)
        diff = (exact_table(trace, l) - t).toarray()
        assert diff.min() >= 0 and diff.max() <= err       # read low, by at most the error


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cap=st.integers(1, 120), cut=st.integers(1, 29))
def test_capped_tables_within_their_bound_built_and_merged(seed, cap, cut):
    trace = uneven_trace(seed)
    starts = np.flatnonzero(np.r_[True, trace.request_id[1:] != trace.request_id[:-1]])
    at = int(starts[min(cut, starts.size - 1)])
    whole = capped(trace, cap)
    assert_within_bound(whole, trace, cap)
    a, b = capped(trace.take(np.arange(at)), cap), capped(trace.take(np.arange(at, 600)), cap)
    assert_within_bound(merge(a, b), trace, cap)
    assert_within_bound(merge(a, b, consume=True), trace, cap)


def test_uncapped_or_unreached_cap_is_exact():
    trace = uneven_trace(3)
    for cap in (0, 10_000):
        s = capped(trace, cap)
        assert not s.token_error.any()
        for l, t in enumerate(s.tokens):
            assert (t != exact_table(trace, l)).nnz == 0


def test_reduce_table_is_misra_gries():
    t = sparse.csr_matrix(np.array([[5, 0, 3], [1, 1, 0], [0, 7, 2]], np.int64))
    r, sub = reduce_table(t, 3)             # 4th largest count is 2: subtract, drop <= 0
    assert sub == 2 and r.nnz == 3
    assert np.array_equal(r.toarray(), [[3, 0, 1], [0, 0, 0], [0, 5, 0]])
    assert reduce_table(t, 10) == (t, 0)


def test_capped_file_round_trip_v1_files_and_cap_mismatch(tmp_path):
    trace = build_trace(T=400, R=40)
    s = capped(trace, 30)
    assert s.token_error.any()
    path = tmp_path / "c.stats"
    save_stats(s, path)
    back = load_stats(path)
    assert back.token_cells == 30 and np.array_equal(back.token_error, s.token_error)
    assert np.array_equal(back.token_occurrences, s.token_occurrences)
    with pytest.raises(InputError, match="token_cells"):
        merge(back, capped(trace, 31))
    # a version 1 file (exact tables, no cap, error or occurrences) loads as cap 0, error 0
    exact = stats_of(trace, parts=("sample", "tokens"))
    exact.token_cells = 0
    arrays = {k: v for k, v in to_arrays(exact).items() if k not in
              ("tokens.error", "tokens.occurrences")}
    header = {k: v for k, v in _header(exact).items() if k != "token_cells"}
    header["version"] = 1
    forge(header, arrays, tmp_path / "v1.stats")
    old = load_stats(tmp_path / "v1.stats")
    assert old.token_cells == 0 and not old.token_error.any()
    assert np.array_equal(old.token_occurrences, exact.token_occurrences)
    assert_same(old, exact)
    header["version"] = 3
    forge(header, arrays, tmp_path / "v3.stats")
    with pytest.raises(InputError, match="version 3 is not supported"):
        load_stats(tmp_path / "v3.stats")


def test_forged_error_beyond_the_bound_is_refused(tmp_path):
    s = capped(build_trace(T=400, R=40), 30)
    arrays = to_arrays(s)
    arrays["tokens.error"] = arrays["tokens.error"] + 10 ** 6
    forge(_header(s), arrays, tmp_path / "f.stats")
    with pytest.raises(InputError, match="outside its cap's bound"):
        load_stats(tmp_path / "f.stats")


def test_merge_all_of_capped_shards_is_the_fold(tmp_path):
    trace = build_trace(T=600, R=60)
    parts = [capped(trace.take(np.arange(lo, lo + 200)), 25) for lo in (0, 200, 400)]
    folded = merge(merge(parts[0], parts[1]), parts[2])
    assert_same(merge_all(parts), folded)
    assert np.array_equal(merge_all(parts).token_error, folded.token_error)


def test_cli_capped_build_then_merge_equals_the_fold(tmp_path):
    """`stats build --token-cells` per shard, then `stats merge`: the in-memory fold."""
    trace = build_trace(T=400, R=40)
    halves = [trace.take(np.arange(0, 200)), trace.take(np.arange(200, 400))]
    for i, h in enumerate(halves):
        write_trace(h, tmp_path / f"{i}.parquet")
        r = run_cli("stats", "build", "--trace", tmp_path / f"{i}.parquet", "--token-cells", 30,
                    "--out", tmp_path / f"{i}.stats")
        assert r.returncode == 0, r.stderr
    r = run_cli("stats", "merge", "--stats", tmp_path / "0.stats", "--stats", tmp_path / "1.stats",
                "--out", tmp_path / "m.stats")
    assert r.returncode == 0, r.stderr
    got = load_stats(tmp_path / "m.stats")
    want = merge(load_stats(tmp_path / "0.stats"), load_stats(tmp_path / "1.stats"))
    assert got.token_cells == 30 and got.token_error.any()
    assert_same(got, want)
    r = run_cli("stats", "info", tmp_path / "m.stats", "--json")
    assert r.returncode == 0 and '"token_error_max"' in r.stdout
