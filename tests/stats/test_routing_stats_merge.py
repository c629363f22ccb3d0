"""Mergeable routing statistics (stats/): the stats of a concatenation equal the
merge of its shards' stats, whatever the cut; merging is associative; the file round-trips and
refuses damage; the CLI refuses mixed models and straddling requests with one line; a placement
from statistics equals the placement from the trace; a local Ray cluster builds the same stats.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import build_trace, run_cli, write_unchecked
from sempar.stats.sample import sample_requests
from sempar.stats.routing_stats import PARTS, merge, merge_all
from sempar.stats.build import StatsBuilder
from sempar.stats.file import load_stats, save_stats
from sempar.trace.io import write_trace

ALL = PARTS


def stats_of(trace, parts=ALL, sample_rows=60, seed=0, name="t", block=7):
    b = StatsBuilder(trace.meta, trace.domains, parts, seed, sample_rows, name)
    for lo in range(0, trace.num_tokens, block):
        sl = slice(lo, lo + block)
        b.add({"token_id": trace.token_id[sl], "request_id": trace.request_id[sl],
               "position": trace.position[sl], "experts": trace.experts[sl],
               "domain": None if trace.domain is None else trace.domain[sl]})
    return b.finish()


def assert_same(a, b):
    assert a.rows == b.rows and a.parts == b.parts
    assert np.array_equal(a.loads, b.loads)
    assert np.array_equal(a.request_ids, b.request_ids)
    assert np.array_equal(a.request_rows, b.request_rows)
    for x, y in zip(a.tokens or [], b.tokens or []):
        assert (x != y).nnz == 0
    if a.tokens is not None:
        assert a.token_cells == b.token_cells
        assert np.array_equal(a.token_error, b.token_error)
        assert np.array_equal(a.token_occurrences, b.token_occurrences)
    for x, y in zip(a.request_experts or [], b.request_experts or []):
        assert (x != y).nnz == 0
    for name in ("coactivation", "transitions"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert a.sample.keys() == b.sample.keys()
    for k in a.sample:
        assert np.array_equal(a.sample[k], b.sample[k]), k


def uneven_trace(seed: int):
    """600 rows in requests of 3..17 rows with scattered ids (not in id order)."""
    rng = np.random.default_rng(seed)
    trace = build_trace(T=600, R=30, seed=seed)
    lengths = rng.integers(3, 18, 80)
    rid = np.repeat(rng.permutation(10_000)[:80], lengths)[:600]
    trace.request_id = np.concatenate([rid, np.full(600 - rid.size, 20_000)]).astype(np.int32)
    return trace


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 29), max_size=4, unique=True),
       budget=st.integers(1, 700))
def test_merged_shards_equal_the_whole(seed, cuts, budget):
    trace = uneven_trace(seed)
    starts = np.flatnonzero(np.r_[True, trace.request_id[1:] != trace.request_id[:-1]])
    bounds = [0, *sorted(int(starts[c]) for c in cuts if c < starts.size), trace.num_tokens]
    shards = [trace.take(np.arange(lo, hi)) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    whole = stats_of(trace, sample_rows=budget)
    parts = [stats_of(s, sample_rows=budget) for s in shards]
    assert_same(merge_all(parts), whole)
    running = stats_of(shards[0], sample_rows=budget)     # build_stats' consuming fold
    for s in shards[1:]:
        running = merge(running, stats_of(s, sample_rows=budget), consume=True)
    assert_same(running, whole)
    # the sample is the rows objective's rule on the whole trace
    rows = sample_requests(trace.request_id, budget, 0)
    assert np.array_equal(whole.sample["row"], rows)
    if len(parts) >= 3:                                  # associative
        assert_same(merge(merge(parts[0], parts[1]), parts[2]),
                    merge(parts[0], merge(parts[1], parts[2])))


def test_file_round_trip_and_damage(tmp_path):
    trace = build_trace()
    s = stats_of(trace)
    path = tmp_path / "t.stats"
    save_stats(s, path)
    assert_same(load_stats(path), s)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01                                     # a bit in the last array's bytes
    bad = tmp_path / "bad.stats"
    bad.write_bytes(bytes(data))
    with pytest.raises(Exception, match="checksum"):
        load_stats(bad)


def test_cli_build_merge_and_refusals(tmp_path):
    trace = build_trace(T=400, R=40)
    a, b = trace.take(np.arange(0, 200)), trace.take(np.arange(200, 400))
    write_trace(a, tmp_path / "a.parquet")
    write_trace(b, tmp_path / "b.parquet")
    write_trace(trace, tmp_path / "whole.parquet")
    for args in (["--trace", tmp_path / "whole.parquet", "--out", tmp_path / "w.stats"],
                 ["--trace", tmp_path / "a.parquet", "--trace", tmp_path / "b.parquet",
                  "--out", tmp_path / "ab.stats", "--jobs", "2"],
                 ["--trace", tmp_path / "a.parquet", "--out", tmp_path / "a.stats"],
                 ["--trace", tmp_path / "b.parquet", "--out", tmp_path / "b.stats"]):
        r = run_cli("stats", "build", *args)
        assert r.returncode == 0, r.stderr
    r = run_cli("stats", "merge", "--stats", tmp_path / "a.stats", "--stats", tmp_path / "b.stats",
                "--out", tmp_path / "m.stats")
    assert r.returncode == 0, r.stderr
    w, ab, m = (load_stats(tmp_path / f) for f in ("w.stats", "ab.stats", "m.stats"))
    assert_same(ab, w)
    assert_same(m, w)
    # another model's shard: one line, exit 2, nothing written
    other = build_trace(N=16)
    write_trace(other, tmp_path / "other.parquet")
    r = run_cli("stats", "build", "--trace", tmp_path / "a.parquet", "--trace",
                tmp_path / "other.parquet", "--out", tmp_path / "x.stats")
    assert r.returncode == 2 and "another model" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "x.stats").exists()
    # a request in two shards
    r = run_cli("stats", "merge", "--stats", tmp_path / "a.stats", "--stats", tmp_path / "a.stats",
                "--out", tmp_path / "x.stats")
    assert r.returncode == 2 and "two shards" in r.stderr
    r = run_cli("stats", "build", "--trace", tmp_path / "a.parquet", "--parts", "nonsense",
                "--out", tmp_path / "x.stats")
    assert r.returncode == 2 and "nonsense" in r.stderr
    # place --stats refuses what it cannot reproduce
    for extra, words in ((["--method", "eplb"], "only the sempar"), (["--seed", "4"], "seed 0"),
                         (["--nodes", "2"], "--nodes"), (["--objective", "tokens"], "rows objective"), (["--homes", "table"], "rows objective")):
        r = run_cli("place", "--stats", tmp_path / "w.stats", "--ep", "4", "--out",
                    tmp_path / "p.json", *extra)
        assert r.returncode == 2 and words in r.stderr, (extra, r.stderr)
        assert not (tmp_path / "p.json").exists()


@pytest.mark.slow
def test_place_from_stats_equals_place_from_trace(tmp_path):
    from sempar.paths import dev_trace_paths
    from sempar.trace import read_trace

    src = {p.stem: p for p in dev_trace_paths()}["tiny-moe64"]
    full = read_trace(src, optional=("domain",))
    keep = np.isin(full.request_id, np.unique(full.request_id)[:120])
    trace = full.take(np.flatnonzero(keep))
    reqs = np.unique(trace.request_id)
    shards = []
    for i, part in enumerate(np.array_split(reqs, 3)):
        p = tmp_path / f"s{i}.parquet"
        write_trace(trace.take(np.flatnonzero(np.isin(trace.request_id, part))), p)
        shards.append(p)
    whole = tmp_path / "whole.parquet"
    write_trace(trace.take(np.concatenate([np.flatnonzero(np.isin(trace.request_id, part))
                                           for part in np.array_split(reqs, 3)])), whole)
    args = [a for p in shards for a in ("--trace", p)]
    assert run_cli("stats", "build", *args, "--out", tmp_path / "s.stats").returncode == 0
    r1 = run_cli("place", "--stats", tmp_path / "s.stats", "--ep", "4", "--out", tmp_path / "a.json")
    r2 = run_cli("place", "--trace", whole, "--objective", "rows", "--ep", "4",
                 "--out", tmp_path / "b.json")
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr, r2.stderr)
    import json

    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    a["info"].pop("fit_stats")
    assert a == b


def three_shards(tmp_path) -> list[str]:
    """Three 200-row shard files of one 600-row trace (row groups of 64)."""
    trace = build_trace(T=600, R=60)
    paths = []
    for i in range(3):
        p = tmp_path / f"s{i}.parquet"
        write_unchecked(trace.take(np.arange(200 * i, 200 * (i + 1))), p, row_group_size=64)
        paths.append(str(p))
    return paths


def test_ray_local_cluster_builds_the_same_stats(tmp_path):
    pytest.importorskip("ray")
    from sempar.stats.run import StatsSettings, build_stats

    paths = three_shards(tmp_path)
    settings_ = StatsSettings(parts=ALL, sample_rows=150, token_cells=40)   # capped: sketched
    local = build_stats(paths, settings_)
    assert local.token_error.any()
    on_ray = build_stats(paths, settings_, runner="ray", jobs=2, ray_address="local")
    assert_same(on_ray, local)


def test_token_counts_in_small_chunks_equal_one_chunk():
    """The token tables counted chunk by chunk (many flushes) equal one chunk's, and the
    direct counts of the trace (stats.build.chunk_token_counts)."""
    from scipy import sparse

    trace = uneven_trace(7)
    one = stats_of(trace, parts=("tokens",))
    b = StatsBuilder(trace.meta, trace.domains, ("tokens",), 0, 60, "t", chunk_ids=50)
    for lo in range(0, trace.num_tokens, 7):
        sl = slice(lo, lo + 7)
        b.add({"token_id": trace.token_id[sl], "request_id": trace.request_id[sl],
               "position": trace.position[sl], "experts": trace.experts[sl], "domain": None})
    many = b.finish()
    V, N, k = trace.meta.vocab_size, trace.meta.num_experts, trace.meta.top_k
    for l in range(trace.meta.num_layers):
        ref = sparse.csr_matrix((np.ones(trace.num_tokens * k, np.int64),
                                 (np.repeat(trace.token_id, k), trace.experts[:, l].ravel())),
                                shape=(V, N))
        ref.sum_duplicates()
        for m in (one.tokens[l], many.tokens[l]):
            assert m.has_canonical_format and (m != ref).nnz == 0
