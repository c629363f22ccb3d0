"""`sempar import arrays`: per-token routing from .npz / .npy arrays (trace/arrays.py), and traces
without token ids (`TraceMeta.has_token_ids`) refused by the methods that need a token table.

The real files (shared/data/real/full-traces) are imported whole when that folder is there (the
import test skips without it); the real traces shipped with sempar (assets/traces, made from
those files by scripts/make-real-assets.sh) are checked always, and anything beyond the import
runs on slices of them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sempar.cli import main
from sempar.errors import InputError
from sempar.paths import real_data_dir, real_trace_path
from sempar.trace import read_header, read_trace, trace_info
from sempar.trace.arrays import import_arrays

T, L, K, N, R = 120, 3, 2, 8, 12


def _full_dir() -> Path | None:
    root = real_data_dir()        # sempar.paths' search only: SEMPAR_REAL_DATA=/nonexistent hides it
    return root / "full-traces" if root is not None and (root / "full-traces").is_dir() else None


FULL = _full_dir()
needs_full = pytest.mark.skipif(FULL is None, reason="shared/data/real/full-traces absent "
                                                     "(set SEMPAR_REAL_DATA)")


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Every optional array, the real files' layout: 12 requests of 10 rows, 3 layers, 8
    experts top-2, weights sorted by decreasing weight, 2 of 3 domains used per request."""
    rng = np.random.default_rng(seed)
    experts = np.argsort(rng.random((T, L, N)), axis=2)[:, :, :K].astype(np.int8)
    weights = -np.sort(-rng.random((T, L, K)), axis=2).astype(np.float16)
    return {"experts": experts, "weights": weights,
            "token_id": rng.integers(0, 50, T).astype(np.int32),
            "position": np.tile(np.arange(10, 20), R).astype(np.int32),
            "request_offsets": np.arange(0, T + 1, 10).astype(np.int64),
            "request_domain": np.array([0, 2, -1] * 4, np.int16),
            "domains": np.array(["code", "law", "math"]),
            "layer_ids": np.array([1, 2, 3], np.int16),
            "num_experts": np.int32(N), "top_k": np.int32(K), "shared_experts": np.int32(2)}


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def _fail(args: list[str], capsys) -> str:
    """Run the CLI; it must exit 2 with one `error:` line. Returns that line."""
    with pytest.raises(SystemExit) as ex:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert ex.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_round_trip_every_array(tmp_path):
    a = _arrays()
    out = tmp_path / "t.parquet"
    s = import_arrays([_npz(tmp_path / "a.npz", **a)], out, model="toy")
    assert (s["tokens"], s["requests"], s["resorted_rows"], s["ignored_arrays"]) == (T, R, 0, [])
    t = read_trace(out)
    m = t.meta
    assert (m.model, m.num_layers, m.num_experts, m.top_k, m.shared_experts, m.layer_ids,
            m.has_token_ids, m.vocab_size) == ("toy", L, N, K, 2, (1, 2, 3), True, 50)
    np.testing.assert_array_equal(t.experts, a["experts"])
    np.testing.assert_array_equal(t.weights, a["weights"].astype(np.float32))
    np.testing.assert_array_equal(t.token_id, a["token_id"])
    np.testing.assert_array_equal(t.position, a["position"])
    np.testing.assert_array_equal(t.request_id, np.repeat(np.arange(R), 10))
    assert t.domains == ["code", "law", "math"]
    np.testing.assert_array_equal(t.domain, np.repeat(a["request_domain"], 10))
    assert trace_info(out)["has_token_ids"] is True


def test_npy_files_per_token_arrays_and_key_overrides(tmp_path):
    """.npy files by stem, per-token request ids and string domains, renamed arrays, no
    positions (derived), unsorted weights (re-sorted), no token ids."""
    a = _arrays(1)
    w = a["weights"].astype(np.float32)
    w[0, 0] = w[0, 0, ::-1]                      # one row out of weight order
    rid = np.repeat(np.arange(R)[::-1], 10).astype(np.int64)   # ids not in row order
    for name, arr in (("sel", a["experts"]), ("probs", w), ("rid", rid),
                      ("dom", np.repeat(np.array(["x", "", "y"] * 4), 10))):
        np.save(tmp_path / f"{name}.npy", arr)
    out = tmp_path / "t.parquet"
    s = import_arrays([tmp_path / f"{n}.npy" for n in ("sel", "probs", "rid", "dom")], out,
                      keys={"experts": "sel", "request_id": "rid", "domain": "dom"},
                      shape={"num_experts": 16, "vocab_size": 100})
    assert (s["resorted_rows"], s["has_token_ids"], s["domains"]) == (1, False, ["x", "y"])
    t = read_trace(out)
    assert (t.meta.num_experts, t.meta.vocab_size, t.meta.has_token_ids) == (16, 100, False)
    assert not t.token_id.any() and t.num_requests == R
    np.testing.assert_array_equal(t.position, np.tile(np.arange(10), R))
    np.testing.assert_array_equal(t.request_id, rid)
    assert t.experts[0, 0].tolist() == a["experts"][0, 0, ::-1].tolist()
    assert (np.diff(t.weights, axis=2) <= 0).all()
    assert t.domain[:10].tolist() == [0] * 10 and t.domain[10:20].tolist() == [-1] * 10
    assert read_header(out)[2].extra["arrays"]["weights"] == "probs"


def test_model_dir_config_and_preset(tmp_path):
    a = _arrays()
    del a["layer_ids"], a["shared_experts"]
    src = _npz(tmp_path / "a.npz", **a)
    cfg = tmp_path / "m"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v2", "n_routed_experts": N, "num_experts_per_tok": K,
        "n_shared_experts": 1, "num_hidden_layers": 4, "first_k_dense_replace": 1,
        "vocab_size": 64}))
    import_arrays([src], tmp_path / "t.parquet", model_dir=cfg)
    m = read_header(tmp_path / "t.parquet")[2]
    assert (m.model, m.layer_ids, m.num_hidden_layers, m.shared_experts, m.vocab_size,
            m.model_type) == ("m", (1, 2, 3), 4, 1, 64, "deepseek_v2")
    with pytest.raises(InputError, match=r"num_experts: 8 from the files but 64 from preset"):
        import_arrays([src], tmp_path / "u.parquet", model="olmoe-1b-7b")
    assert not (tmp_path / "u.parquet").exists()


BAD = [  # (arrays edit, extra CLI args, message pattern)
    (lambda a: a.pop("experts"), [], r"^error: experts: no such array"),
    (lambda a: a.update(weights=a["weights"][:, :2]), [], r"weights: shape \(120, 2, 2\)"),
    (lambda a: a.update(token_id=a["token_id"][:-1]), [], r"token_id: shape \(119,\), expected \(120,\)"),
    (lambda a: a.update(experts=a["experts"].astype(np.float32)), [], r"experts: .*dtype float32"),
    (lambda a: a["experts"].__setitem__((7, 1, 0), 9), [], r"experts: row 7 layer 1 slot 0: expert id 9 out of range"),
    (lambda a: a["experts"].__setitem__((7, 1, 0), -1), [], r"experts: row 7 layer 1 slot 0: expert id -1 is negative"),
    (lambda a: a["experts"].__setitem__((5, 0, 1), a["experts"][5, 0, 0]), [], r"experts: row 5 layer 0: duplicate expert"),
    (lambda a: a["token_id"].__setitem__(33, 99), ["--vocab-size", "50"], r"token_id: row 33: value 99 out of range"),
    (lambda a: a["token_id"].__setitem__(33, -4), [], r"token_id: row 33: value -4 is not in"),
    (lambda a: a.update(request_offsets=a["request_offsets"][:-1]), [], r"request_offsets: offsets run 0..110, expected 0..120"),
    (lambda a: a["request_offsets"].__setitem__(3, 20), [], r"request_offsets: request 2: offsets 20 -> 20 is empty"),
    (lambda a: a.update(request_domain=a["request_domain"][:-1]), [], r"request_domain: shape \(11,\), expected \(12,\)"),
    (lambda a: a["request_domain"].__setitem__(4, 3), [], r"request_domain: request 4: index 3 names no domain"),
    (lambda a: a.update(request_id=np.zeros(T, np.int32)), [], r"give request offsets or per-token request ids, not both"),
    (lambda a: a.update(layer_ids=np.array([1, 2])), [], r"layer_ids: shape \(2,\), expected \(3,\)"),
    (lambda a: None, ["--top-k", "3"], r"top_k: 3 from the options but 2 from the files"),
    (lambda a: None, ["--weights-key", "w"], r"--weights-key w: no such array"),
    (lambda a: a["weights"].__setitem__((2, 2, 1), np.inf), [], r"weights: row 2 layer 2 slot 0: value inf"),
]


@pytest.mark.parametrize("edit,args,pattern", BAD, ids=[p[2][:40] for p in BAD])
def test_bad_inputs_one_line_exit_2_no_output(edit, args, pattern, tmp_path, capsys):
    a = _arrays()
    edit(a)
    src = _npz(tmp_path / "a.npz", **a)
    out = tmp_path / "out" / "t.parquet"
    out.parent.mkdir()
    line = _fail(["import", "arrays", str(src), "--out", str(out), *args], capsys)
    import re
    assert re.search(pattern, line), line
    assert list(out.parent.iterdir()) == []


def test_unreadable_and_pickled_files(tmp_path, capsys):
    bad = tmp_path / "x.npz"
    bad.write_bytes(b"PK\x03\x04 not a zip")
    assert "not a readable .npz / .npy file" in _fail(
        ["import", "arrays", str(bad), "--out", str(tmp_path / "t.parquet")], capsys)
    np.save(tmp_path / "experts.npy", np.array([[1], [1, 2]], dtype=object), allow_pickle=True)
    assert "not a readable" in _fail(["import", "arrays", str(tmp_path / "experts.npy"),
                                      "--out", str(tmp_path / "t.parquet")], capsys)
    assert not (tmp_path / "t.parquet").exists()
    src = _npz(tmp_path / "a.npz", **_arrays())
    before = src.read_bytes()
    _fail(["import", "arrays", str(src), "--out", str(src)], capsys)
    assert src.read_bytes() == before


def _no_ids_trace(tmp_path: Path) -> Path:
    """A 2-domain trace without token ids whose experts follow the requests' domain."""
    rng = np.random.default_rng(3)
    Tn, Rn = 600, 30
    dom = np.arange(Rn) % 2
    base = np.repeat(dom, Tn // Rn)[:, None, None] * 4
    experts = (base + np.argsort(rng.random((Tn, 2, 4)), axis=2)[:, :, :2]).astype(np.int16)
    src = _npz(tmp_path / "n.npz", experts=experts,
               request_offsets=np.arange(0, Tn + 1, Tn // Rn), request_domain=dom,
               domains=np.array(["a", "b"]))
    out = tmp_path / "n.parquet"
    import_arrays([src], out, model="noids")
    return out


def test_token_table_methods_refuse_a_trace_without_ids(tmp_path, capsys):
    trace = _no_ids_trace(tmp_path)
    for method, mode in (("semmoe", "tp"), ("metis", "dp"), ("smoe-cem", "tp"),
                         ("kmeans2d", "tp")):
        line = _fail(["place", "--trace", str(trace), "--method", method, "--mode", mode, "--ep",
                      "2", "--out", str(tmp_path / "p.json")], capsys)
        assert "needs token ids" in line and "methods without: eplb" in line, line
    line = _fail(["place", "--trace", str(trace), "--objective", "tokens", "--ep", "2",
                  "--out", str(tmp_path / "p.json")], capsys)
    assert "sempar --objective tokens needs token ids" in line, line
    assert not (tmp_path / "p.json").exists()
    # sempar in tp solves on the fit rows (rows objective), without a token table
    with pytest.raises(SystemExit) as ex:
        main(["place", "--trace", str(trace), "--ep", "2", "--out", str(tmp_path / "p.json")])
    assert ex.value.code == 0
    capsys.readouterr()
    info = json.loads((tmp_path / "p.json").read_text())["info"]
    assert info["objective"] == "rows" and "token_table" not in info
    (tmp_path / "p.json").unlink()
    # sempar in dp places requests (on the rows objective too): allowed, without a token table
    with pytest.raises(SystemExit) as ex:
        main(["place", "--trace", str(trace), "--mode", "dp", "--ep", "2",
              "--out", str(tmp_path / "p.json")])
    assert ex.value.code == 0
    capsys.readouterr()
    info = json.loads((tmp_path / "p.json").read_text())["info"]
    assert "token_table" not in info and info["objective"] == "rows"
    line = _fail(["evaluate", "--fit", str(trace), "--split", "--ep", "2", "--methods", "vanilla",
                  "--online"], capsys)
    assert line.startswith("error: --online needs token ids")


def test_evaluate_skips_token_table_methods(tmp_path, capsys):
    trace = _no_ids_trace(tmp_path)
    with pytest.raises(SystemExit) as ex:
        main(["evaluate", "--fit", str(trace), "--split", "--ep", "2", "--json",
              "--methods", "all"])
    assert ex.value.code == 0
    res = json.loads(capsys.readouterr().out)
    table_methods = {"semmoe", "smoe-cem", "metis", "kmeans2d"}
    assert table_methods == set(res["skipped"]) and not table_methods & set(res["methods"])
    assert {"vanilla", "eplb", "sempar"} <= set(res["methods"])
    assert all("needs token ids" in why for why in res["skipped"].values())
    line = _fail(["evaluate", "--fit", str(trace), "--split", "--ep", "2", "--methods", "semmoe"],
                 capsys)
    assert "semmoe needs token ids" in line


def test_evaluate_with_ids_fit_and_id_less_eval(tmp_path, capsys):
    """A token table fitted with ids cannot place eval tokens without them."""
    from sempar.placement.base import solve
    from sempar.schedule.evaluate import evaluate
    from sempar.solve_options import SolveOptions
    from sempar.schedule.homes import method_home
    from sempar.trace.ops import without_token_ids

    import_arrays([_npz(tmp_path / "a.npz", **_arrays())], tmp_path / "a.parquet")
    fit = read_trace(tmp_path / "a.parquet")
    ev = without_token_ids(fit)
    res = evaluate(fit, ev, 2, SolveOptions(mode="dp"), methods=None)
    assert "semmoe" in res["skipped"] and "semmoe" not in res["methods"]
    placement = solve("semmoe", fit, num_devices=2)
    with pytest.raises(InputError, match="semmoe's token table needs token ids"):
        method_home(placement, ev, "tp")


@needs_full
def test_real_files_import(tmp_path, capsys):
    for name, tokens, requests, ids in (("deepseek-v2-lite-esft", 25028, 173, False),
                                        ("gpt-oss-20b-mmlu", 152445, 524, True)):
        out = tmp_path / f"{name}.parquet"
        with pytest.raises(SystemExit) as ex:
            main(["import", "arrays", str(FULL / f"{name}.npz"), "--out", str(out)])
        assert ex.value.code == 0
        with pytest.raises(SystemExit):
            main(["trace", "info", str(out), "--json"])
        info = json.loads(capsys.readouterr().out)
        assert (info["tokens"], info["requests"], info["has_token_ids"], info["has_weights"]) == \
            (tokens, requests, ids, True)
    m = read_header(tmp_path / "deepseek-v2-lite-esft.parquet")[2]
    assert (m.layer_ids, m.shared_experts, m.num_experts, m.top_k) == (tuple(range(1, 27)), 2, 64, 6)
    assert len(info["domains"]) == 70 and sum(info["domains"].values()) == 152445


def test_packaged_real_traces():
    """The real traces that ship: their shape, counts, provenance in the metadata, and the NOTICE
    naming each file's licence, source and commit."""
    notice = (real_trace_path("gpt-oss-20b").parent / "NOTICE").read_text()
    for name, tokens, requests, ids, licence, commit in (
            ("deepseek-v2-lite", 25028, 173, False, "MIT", "579a771"),
            ("gpt-oss-20b", 152445, 524, True, "Apache-2.0", "72b368f")):
        info = trace_info(real_trace_path(name))
        assert (info["tokens"], info["requests"], info["has_token_ids"]) == (tokens, requests, ids)
        meta = read_header(real_trace_path(name))[2]
        prov = meta.extra["provenance"]
        assert prov["licence"] == licence and commit in prov["source"] and meta.model == name
        assert real_trace_path(name).name in notice and commit in notice
    assert real_trace_path("gpt-oss-20b-mmlu") == real_trace_path("gpt-oss-20b")
    with pytest.raises(InputError, match="not one of"):
        real_trace_path("../tiny-moe64")


def test_real_deepseek_slice_evaluate(tmp_path, capsys):
    """Evaluate on 12 requests of the real DeepSeek trace (no token ids): no token-table figure;
    sempar solves on the fit rows and beats vanilla's exact pre-routed LAR."""
    tr = read_trace(real_trace_path("deepseek-v2-lite"))
    o = np.r_[0, np.cumsum(np.bincount(tr.request_id))]
    pick = np.r_[0:4, 60:64, 120:124]
    rows = np.concatenate([np.arange(o[r], o[r + 1]) for r in pick])
    src = _npz(tmp_path / "s.npz", experts=tr.experts[rows][:, :4].astype(np.int16),
               request_offsets=np.r_[0, np.cumsum(np.diff(o)[pick])],
               request_domain=tr.domain[o[pick]], domains=np.array(tr.domains),
               layer_ids=np.array(tr.meta.layer_ids[:4]), num_experts=tr.meta.num_experts)
    out = tmp_path / "s.parquet"
    import_arrays([src], out)
    with pytest.raises(SystemExit) as ex:
        main(["evaluate", "--fit", str(out), "--split", "--ep", "4", "--methods",
              "vanilla,eplb,sempar", "--json"])
    assert ex.value.code == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res["methods"]) == {"vanilla", "eplb", "sempar"}
    m = res["methods"]
    assert m["sempar"]["oracle_lar_mean"] > m["vanilla"]["oracle_lar_mean"] + 0.05
    assert "needs token ids" in _fail(["evaluate", "--fit", str(out), "--split", "--ep", "4",
                                       "--methods", "semmoe"], capsys)


def test_has_token_ids_metadata(tmp_path, trace):
    """Written only when False (traces with ids keep their bytes); a file without the field
    reads as having ids; a non-boolean is refused; concat of both kinds has none."""
    import dataclasses

    from conftest import read_block, rewrite
    from sempar.trace import concat, write_trace
    from sempar.trace.schema import TraceMeta

    write_trace(trace, tmp_path / "a.parquet")
    assert "has_token_ids" not in read_block(tmp_path / "a.parquet")["meta"]
    assert read_header(tmp_path / "a.parquet")[2].has_token_ids is True
    no_ids = dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, has_token_ids=False))
    write_trace(no_ids, tmp_path / "b.parquet")
    assert read_block(tmp_path / "b.parquet")["meta"]["has_token_ids"] is False
    assert trace_info(tmp_path / "b.parquet")["has_token_ids"] is False
    assert concat([trace, no_ids]).meta.has_token_ids is False
    assert concat([trace, trace]).meta.has_token_ids is True
    rewrite(tmp_path / "b.parquet", tmp_path / "c.parquet",
            block_edit=lambda b: b["meta"].update(has_token_ids="no"))
    with pytest.raises(InputError, match=r"metadata.has_token_ids: 'no' is not true or false"):
        read_header(tmp_path / "c.parquet")
    with pytest.raises(InputError, match="has_token_ids"):
        TraceMeta("m", 1, 2, 1, 10, has_token_ids=1)


def test_config_shape_of_packaged_models():
    from sempar.paths import assets_dir
    from sempar.trace.hf_config import config_shape

    models = assets_dir() / "models"
    if not (models / "tiny-mixtral" / "config.json").is_file():
        pytest.skip("packaged tiny models absent")
    s = config_shape(models / "tiny-mixtral")
    assert (s["num_experts"], s["top_k"], s["shared_experts"], s["layer_ids"], s["model_type"]) == \
        (8, 2, 0, tuple(range(6)), "mixtral")
    s = config_shape(models / "tiny-moe64")
    assert (s["num_experts"], s["top_k"], s["layer_ids"]) == (64, 8, tuple(range(6)))
