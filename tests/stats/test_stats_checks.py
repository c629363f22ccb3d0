"""A stats file whose SHA-256 was recomputed after an edit (the hash has no key) is still
checked part by part on load (stats/checks.py): the audit's forged files are one line and
exit 2, and every mutation of a valid file is refused in one line or loads into valid figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import build_trace
from hostile import refused, run
from sempar.errors import InputError
from sempar.stats.file import HEADER_KEY, checksum, load_stats, save_stats
from sempar.stats.routing_stats import PARTS
from test_routing_stats_merge import stats_of


def read_raw(path):
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(str(path), framework="np") as f:
        header = json.loads(f.metadata()[HEADER_KEY])
    return header, dict(load_file(str(path)))


def forge(header: dict, arrays: dict, path) -> None:
    """Write `arrays` with `header` and a recomputed SHA-256: what anyone can do."""
    from safetensors.numpy import save_file

    header = dict(header)
    header["sha256"] = checksum(header, arrays)
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path),
              metadata={HEADER_KEY: json.dumps(header)})


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """(header, arrays) of a valid stats file with every part (4 layers, 8 experts, k 2)."""
    path = tmp_path_factory.mktemp("stats") / "good.stats"
    save_stats(stats_of(build_trace(T=240, R=24, L=4), parts=PARTS, sample_rows=60), path)
    return read_raw(path)


def _edit(arrays, name, fn):
    a = dict(arrays)
    a[name] = fn(a[name].copy())
    return a


def _set(a, index, value):
    a[index] = value
    return a


FORGED = {   # the audit's cases: each recomputes the hash, each used to load (or crash later)
    "negative load": lambda h, a: (h, _edit(a, "loads", lambda x: _set(x, (0, 0), -5))),
    "NaN load": lambda h, a: (h, _edit(a, "loads", lambda x: _set(x.astype(np.float64), (0, 0),
                                                                   np.nan))),
    "request sizes 5 short": lambda h, a: (h, _edit(a, "request_rows", lambda x: x[:-5])),
    "token index 999 of 8": lambda h, a: (h, _edit(a, "tokens.indices",
                                                   lambda x: _set(x, 0, 999))),
    "loads of 2^62": lambda h, a: (h, _edit(a, "loads", lambda x: _set(x, (0, 1), 2**62))),
    "every sample row 0": lambda h, a: (h, _edit(a, "sample.row", lambda x: x * 0)),
    "sample expert 8 of 8": lambda h, a: (h, _edit(a, "sample.experts",
                                                   lambda x: _set(x, (0, 0, 0), 8))),
    "coactivation off its loads": lambda h, a: (h, _edit(a, "coactivation",
                                                         lambda x: _set(x, (0, 1, 2), x[0, 1, 2] + 1))),
    "a part it does not hold": lambda h, a: (
        {**h, "parts": [p for p in h["parts"] if p != "transitions"]}, a),
    "an escape sequence in the model name": lambda h, a: (
        {**h, "meta": {**h["meta"], "model": "toy\x1b[2J"}}, a),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_stats_are_refused_in_one_line(good, tmp_path, case):
    header, arrays = FORGED[case](*good)
    path = tmp_path / "forged.stats"
    forge(header, arrays, path)
    line = refused(["stats", "info", path], tmp_path)
    assert "checksum" not in line, line        # the hash matched: the contents were refused
    assert "\x1b" not in line


def test_the_unforged_file_loads(good, tmp_path):
    forge(*good, tmp_path / "same.stats")
    code, out, err = run(["stats", "info", tmp_path / "same.stats"], tmp_path)
    assert code == 0, err


# ---- property: every mutation refused in one line, or valid figures ------------------------

VALUES = st.sampled_from([0, 1, -1, 2, 7, 8, 63, 64, 999, 2**31, 2**62, -2**63, 2**63 - 1])


def _mutate_array(arrays, data):
    name = data.draw(st.sampled_from(sorted(arrays)))
    a = arrays[name].copy()
    kind = data.draw(st.sampled_from(["element", "truncate", "float", "zeros", "reverse"]))
    if kind == "element" and a.size:
        i = data.draw(st.integers(0, a.size - 1))
        a.reshape(-1)[i] = np.array(data.draw(VALUES)).astype(a.dtype)
    elif kind == "truncate" and a.shape[0]:
        a = a[:data.draw(st.integers(0, a.shape[0] - 1))]
    elif kind == "float":
        a = a.astype(np.float64)
        if a.size:
            a.reshape(-1)[0] = data.draw(st.sampled_from([np.nan, np.inf, -0.5, 1e300]))
    elif kind == "zeros":
        a = np.zeros_like(a)
    else:
        a = a[::-1]
    arrays = dict(arrays)
    if data.draw(st.booleans()) and name != "loads":
        arrays.pop(name)             # or drop an array altogether
    else:
        arrays[name] = a
    return arrays


def _mutate_header(header, data):
    header = json.loads(json.dumps(header))
    key = data.draw(st.sampled_from(["seed", "sample_rows", "shards", "domains", "parts",
                                     "sample_cut", "meta.num_experts", "meta.top_k",
                                     "meta.vocab_size", "meta.num_layers", "meta.has_token_ids"]))
    value = data.draw(st.one_of(VALUES, st.none(), st.just("x"), st.just([]),
                                st.just([["a", 5]]), st.just(["sample"]), st.just(True)))
    if key.startswith("meta."):
        header["meta"][key[5:]] = value
    else:
        header[key] = value
    return header


def assert_valid_figures(s) -> None:
    """What the verbs read from a loaded file: finite, non-negative, in range, consistent."""
    m = s.meta
    L, N, k = m.num_layers, m.num_experts, m.top_k
    assert s.loads.dtype == np.int64 and s.loads.shape == (L, N) and s.loads.min() >= 0
    assert (s.loads.sum(axis=1) == s.rows * k).all()
    assert s.request_rows.min() >= 1 and int(s.request_rows.sum()) == s.rows
    if s.sample is not None:
        t = s.sample_trace().validate()
        assert t.experts.max() < N and (np.diff(s.sample["row"]) > 0).all()
        assert s.sample["row"].size == 0 or s.sample["row"].max() < s.rows
    for tables in (s.tokens, s.request_experts):
        for t in tables or []:
            assert t.data.min(initial=1) >= 1 and t.indices.max(initial=0) < N
    for x in (s.coactivation, s.transitions):
        assert x is None or x.min(initial=0) >= 0


@settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_mutation_is_refused_or_valid(good, tmp_path, data):
    header, arrays = good
    if data.draw(st.booleans()):
        arrays = _mutate_array(arrays, data)
    else:
        header = _mutate_header(header, data)
    path = tmp_path / "m.stats"
    forge(header, arrays, path)
    try:
        s = load_stats(path)
    except InputError as err:
        assert str(err) and "\n" not in str(err) and "Traceback" not in str(err)
        return
    assert_valid_figures(s)


# ---- model identity, --parts and an output folder no file can be made in --------------------

def _renamed(trace, model):
    import dataclasses

    trace.meta = dataclasses.replace(trace.meta, model=model)
    return trace


def test_shards_of_another_model_of_the_same_shape_are_refused(tmp_path):
    from sempar.trace.io import write_trace

    a = build_trace(T=120, R=12)
    b = _renamed(build_trace(T=120, R=12, seed=5), "another-moe")
    b.request_id = b.request_id + 1000
    write_trace(a, tmp_path / "a.parquet")
    write_trace(b, tmp_path / "b.parquet")
    out = tmp_path / "x.stats"
    refused(["stats", "build", "--trace", tmp_path / "a.parquet", "--trace",
             tmp_path / "b.parquet", "--out", out], tmp_path, "another model", out)
    save_stats(stats_of(a), tmp_path / "a.stats")
    save_stats(stats_of(b), tmp_path / "b.stats")
    refused(["stats", "merge", "--stats", tmp_path / "a.stats", "--stats", tmp_path / "b.stats",
             "--out", out], tmp_path, "another model", out)


def test_explicit_token_parts_on_a_trace_without_token_ids_are_refused(tmp_path):
    import dataclasses

    from sempar.trace.io import write_trace

    t = build_trace(T=120, R=12)
    t.meta = dataclasses.replace(t.meta, has_token_ids=False)
    t.token_id = t.token_id * 0
    write_trace(t, tmp_path / "t.parquet")
    out = tmp_path / "x.stats"
    refused(["stats", "build", "--trace", tmp_path / "t.parquet", "--parts", "sample,tokens",
             "--out", out], tmp_path, "--parts tokens", out)
    code, _, err = run(["stats", "build", "--trace", tmp_path / "t.parquet", "--out", out],
                       tmp_path)                 # the default set still drops it quietly
    assert code == 0, err


def test_an_output_folder_where_no_file_can_be_made_is_refused_first(tmp_path, monkeypatch):
    """Root passes os.access on /sys (a file system of no blocks): refused before the build,
    not after it naming the temporary file; the folder is not touched."""
    import os

    from sempar.trace.io import write_trace

    write_trace(build_trace(T=120, R=12), tmp_path / "t.parquet")
    sealed = tmp_path / "sealed"
    sealed.mkdir()
    real = os.statvfs

    class NoBlocks:
        f_blocks = 0

    monkeypatch.setattr(os, "statvfs", lambda p: NoBlocks() if str(p) == str(sealed)
                        else real(p))
    before = sealed.stat().st_mtime_ns
    refused(["stats", "build", "--trace", tmp_path / "t.parquet", "--out", sealed / "x.stats"],
            tmp_path, "not writable", sealed / "x.stats")
    assert list(sealed.iterdir()) == [] and sealed.stat().st_mtime_ns == before
    monkeypatch.undo()
    if os.geteuid() == 0 and os.path.isdir("/sys") and os.statvfs("/sys").f_blocks == 0:
        refused(["stats", "build", "--trace", tmp_path / "t.parquet", "--out", "/sys/x.stats"],
                tmp_path, "not writable")
