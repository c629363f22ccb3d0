"""Statistics of the real routing aggregates (sempar.affinity.aggregates) and their plots.

Unit tests run on tiny hand-made npz folders with hand-computed answers; the real-data tests run
on shared/data/real/olmoe-routing-aggregates and skip when it is absent.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from sempar.affinity.aggregates import analyze_aggregates, uniform_baseline
from sempar.errors import InputError
from sempar.paths import real_data_dir
from sempar.report.aggregate_plots import plot_aggregates


def _real_dir() -> Path | None:
    root = real_data_dir()              # sempar.paths' search: $SEMPAR_REAL_DATA, else ../shared
    if root is None:
        return None
    for cand in (root / "olmoe-routing-aggregates", root):
        if cand.is_dir() and any(cand.glob("olmoe_*.npz")):
            return cand
    return None


REAL = _real_dir()
needs_real = pytest.mark.skipif(REAL is None, reason="shared/data/real/olmoe-routing-aggregates "
                                                     "absent (set SEMPAR_REAL_DATA)")


def _save(folder: Path, name: str, **arrays) -> None:
    np.savez(folder / name, **arrays)


def _tokens(rows: list[tuple[int, int, int]], layer: int = 0) -> dict[str, np.ndarray]:
    """A token_expert_counts layer from (token_id, expert, count) rows."""
    a = np.array(rows)
    return {f"layer{layer}_token_id": a[:, 0].astype(np.int32),
            f"layer{layer}_expert": a[:, 1].astype(np.int16),
            f"layer{layer}_count": a[:, 2].astype(np.int32)}


def _pairs(rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """Mixtral-shaped (N=8, k=2) files for domains a and b, plus one OLMoE token file.

    Token 5 always routes to experts (1, 2): 3 occurrences in a, 1 in b.
    Token 9 routes (0, 3), (0, 3) in a and (0, 3), (0, 6) in b: pooled counts e0 4, e3 3, e6 1.
    Token 7 occurs once (below min_occurrences=2). OLMoE token 42 routes to experts 0..7 5 times.
    """
    _save(tmp_path, "mistral_token_expert_counts_a.npz",
          **_tokens([(5, 1, 3), (5, 2, 3), (9, 0, 2), (9, 3, 2), (7, 0, 1), (7, 1, 1)]))
    _save(tmp_path, "mistral_token_expert_counts_b.npz",
          **_tokens([(5, 1, 1), (5, 2, 1), (9, 0, 2), (9, 3, 1), (9, 6, 1)]))
    _save(tmp_path, "olmoe_token_expert_counts_x.npz", **_tokens([(42, e, 5) for e in range(8)]))
    # Expert counts: a loads expert 0, b expert 1, c experts 1 and 2 half each.
    eye = np.eye(8, dtype=np.int64) * 10
    for dom, load in (("a", eye[0]), ("b", eye[1]), ("c", eye[1] + eye[2])):
        _save(tmp_path, f"mistral_expert_counts_{dom}.npz", layer0=load)
    # Crosslayer: expert i -> (i + 1) % 8 in a; in b i -> i and i -> i + 2 (5 each).
    nxt = [(i, (i + 1) % 8, 10) for i in range(8)]
    _save(tmp_path, "mistral_expert_counts_crosslayer_a.npz", layers0_7_pairs=_pairs(nxt))
    _save(tmp_path, "mistral_expert_counts_crosslayer_b.npz", layers0_7_pairs=_pairs(
        [(i, i, 5) for i in range(8)] + [(i, (i + 2) % 8, 5) for i in range(8)]))
    _save(tmp_path, "mistral_expert_counts_crosslayer_top1_a.npz", layers0_7_pairs=_pairs(nxt))
    _save(tmp_path, "mistral_expert_counts_crosslayer_top1_b.npz",
          layers0_7_pairs=_pairs([(i, (i + 1) % 8, 5) for i in range(8)]))
    (tmp_path / "README.txt").write_text("not data")
    return tmp_path


def _kurt(x) -> float:
    d = np.asarray(x, float) - np.mean(x)
    return float(np.mean(d**4) / np.mean(d**2) ** 2)


def test_token_table_pooled_and_per_domain(toy: Path) -> None:
    r = analyze_aggregates(toy)
    m = r["models"]["mixtral"]
    assert (m["num_experts"], m["top_k"], m["layer_ids"]) == (8, 2, [0])
    (row,) = m["layers"]
    # Pooled: token 5 -> cum 1, max 0; token 9 -> cum 7/8, max 1/8; token 7 is dropped.
    assert row["f1"] is None and row["tokens"] == 2 and row["token_ids"] == 3
    assert row["cum_hotness_topk"] == pytest.approx({"p25": 0.90625, "p50": 0.9375, "p75": 0.96875})
    assert row["f1_in_sample_bound"] == row["cum_hotness_topk"]
    assert row["f1_in_sample_mean"] == pytest.approx((4 * 1.0 + 4 * 0.875) / 8)
    assert row["max_hotness_non_topk"]["p50"] == pytest.approx(0.0625)
    k5, k9 = _kurt([0, 4, 4, 0, 0, 0, 0, 0]), _kurt([4, 0, 0, 3, 0, 0, 1, 0])
    assert k5 == pytest.approx(7 / 3) and k9 == pytest.approx(12.75 / 2.25**2)
    assert row["kurtosis_p50"] == pytest.approx((k5 + k9) / 2)
    assert row["occurrences"] == (8 + 8 + 2) // 2
    # Per domain: in a token 5 (3 occ.) and 9 (2 occ.) are both pure; in b only token 9 counts.
    a, b = (m["per_domain"][d]["layers"][0] for d in ("a", "b"))
    assert a["tokens"] == 2 and a["cum_hotness_topk"]["p50"] == 1.0
    assert a["max_hotness_non_topk"]["p75"] == 0.0
    assert b["tokens"] == 1 and b["cum_hotness_topk"]["p50"] == pytest.approx(0.75)
    assert b["max_hotness_non_topk"]["p50"] == pytest.approx(0.25)
    # OLMoE token always on the same 8 of 64: cum 1, max 0, kurtosis (1-3p(1-p))/(p(1-p)), p=1/8.
    o = r["models"]["olmoe"]
    (orow,) = o["layers"]
    p = 1 / 8
    assert orow["cum_hotness_topk"]["p50"] == 1.0 and orow["max_hotness_non_topk"]["p50"] == 0.0
    assert orow["kurtosis_p50"] == pytest.approx((1 - 3 * p * (1 - p)) / (p * (1 - p)))
    assert set(o) >= {"per_domain", "summary"} and "crosslayer" not in o and "domain_js" not in o


def test_domain_js_and_imbalance(toy: Path) -> None:
    m = analyze_aggregates(toy)["models"]["mixtral"]
    assert m["domain_js_domains"] == ["a", "b", "c"]
    # b = [0, 1, 0], c = [0, .5, .5]: mixture [0, .75, .25]; disjoint supports give distance 1.
    bc = math.sqrt((math.log2(1 / 0.75) + 0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(2)) / 2)
    assert np.allclose(m["domain_js"]["0"], [[0, 1, 1], [1, 0, bc], [1, bc, 0]], atol=1e-5)
    row = m["layers"][0]
    assert row["domain_js_mean"] == pytest.approx((2 + bc) / 3)
    assert row["load_imbalance_max_mean"] == pytest.approx(20 / (40 / 8))
    assert m["domains"] == ["a", "b", "c"]
    assert m["summary"]["domain_js_mean"] == pytest.approx((2 + bc) / 3)


def test_crosslayer_masses(toy: Path) -> None:
    (e,) = analyze_aggregates(toy)["models"]["mixtral"]["crosslayer"]
    assert (e["from"], e["to"], e["uniform"], e["uniform_top1"]) == (0, 7, 0.25, 0.125)
    assert e["top1_mass"] == pytest.approx(1.0)            # i -> i+1 always
    assert e["topk_mass"] == pytest.approx(0.75)    # pooled row i: 10 on i+1, 5 on i, 5 on i+2
    assert e["top1_mass_independent"] == pytest.approx(1 / 8)
    assert e["topk_mass_independent"] == pytest.approx(2 / 8)
    assert e["matrix"][0] == pytest.approx([0.25, 0.5, 0.25, 0, 0, 0, 0, 0])
    assert e["pairs"] == 8 * 10 + 16 * 5


def test_result_is_plain_json(toy: Path) -> None:
    r = analyze_aggregates(toy)
    assert json.loads(json.dumps(r, allow_nan=False)) == r
    assert r["source"] == str(toy) and r["min_occurrences"] == 2


def test_uniform_baseline_exact_and_near_k_over_n() -> None:
    one = uniform_baseline(np.ones(50, np.int64), 8, 2, 100)   # one occurrence: k distinct experts
    assert one["cum_hotness_topk_p50"] == 1.0 and one["max_hotness_non_topk_p50"] == 0.0
    assert one["kurtosis_p50"] == pytest.approx(7 / 3) and one["tokens_sampled"] == 50
    many = uniform_baseline(np.full(300, 500, np.int64), 64, 8, 200)
    assert many["tokens_sampled"] == 200
    assert 0.125 < many["cum_hotness_topk_p50"] < 0.17
    assert 2.4 < many["kurtosis_p50"] < 3.2
    assert many == uniform_baseline(np.full(300, 500, np.int64), 64, 8, 200)   # seeded


def test_partial_models_only_what_exists(tmp_path: Path) -> None:
    for prefix in ("olmoe-sft", "olmoe"):
        _save(tmp_path, f"{prefix}_expert_counts_tulu.npz", layer0=np.arange(1, 65),
              layer7=np.ones(64, np.int64))
    r = analyze_aggregates(tmp_path)["models"]
    assert set(r) == {"olmoe", "olmoe-sft"}
    sft = r["olmoe-sft"]
    assert sft["layer_ids"] == [0, 7] and "per_domain" not in sft and "crosslayer" not in sft
    assert sft["layers"][0]["domain_js_mean"] is None
    assert sft["layers"][0]["load_imbalance_max_mean"] == pytest.approx(64 / 32.5)
    assert [x["js"] for x in sft["js_vs_base"]["layers"]] == pytest.approx([0.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("case", ["missing", "is_file", "no_matching", "unreadable", "lacks_array",
                                  "expert_out_of_range", "pairs_shape", "negative_count"])
def test_bad_input(tmp_path: Path, case: str) -> None:
    folder, match = tmp_path, None
    if case == "missing":
        folder, match = tmp_path / "nope", "no such folder"
    elif case == "is_file":
        folder = tmp_path / "x.npz"
        folder.write_text("x")
        match = "is a file"
    elif case == "no_matching":
        (tmp_path / "notes.txt").write_text("x")
        _save(tmp_path, "gpt_expert_counts_arxiv.npz", layer0=np.ones(8))
        match = "no routing-aggregate files"
    elif case == "unreadable":
        (tmp_path / "mistral_expert_counts_a.npz").write_text("not a zip")
        match = "not a readable .npz"
    elif case == "lacks_array":
        t = _tokens([(1, 0, 2), (1, 1, 2)])
        del t["layer0_count"]
        _save(tmp_path, "mistral_token_expert_counts_a.npz", **t)
        match = "no array 'layer0_count'"
    elif case == "expert_out_of_range":
        _save(tmp_path, "mistral_token_expert_counts_a.npz", **_tokens([(1, 8, 2), (1, 1, 2)]))
        match = r"'layer0_expert': value 8 is out of range \[0, 8\)"
    elif case == "pairs_shape":
        _save(tmp_path, "mistral_expert_counts_crosslayer_a.npz",
              layers0_7_pairs=np.ones((4, 2), np.int64))
        match = r"expected \[rows, 3\]"
    elif case == "negative_count":
        _save(tmp_path, "mistral_expert_counts_a.npz", layer0=-np.ones(8, np.int64))
        match = "is negative"
    with pytest.raises(InputError, match=match) as err:
        analyze_aggregates(folder)
    assert "\n" not in str(err.value)


def test_plots_on_toy(toy: Path, tmp_path: Path) -> None:
    paths = plot_aggregates(analyze_aggregates(toy), tmp_path / "plots" / "sub")
    names = sorted(p.name for p in paths)
    assert names == ["real-mixtral-crosslayer.png", "real-mixtral-domain-js.png",
                     "real-mixtral-hotness.png", "real-olmoe-hotness.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000


# -- real data ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real() -> dict:
    if REAL is None:
        pytest.skip("real aggregates absent")
    t = time.perf_counter()
    r = analyze_aggregates(REAL)
    r["_seconds"] = time.perf_counter() - t
    return r


# Measured on the real aggregates (pooled over arxiv/book/github/wikipedia, min_occurrences=2).
OLMOE_CUM_P50 = {0: 0.667, 7: 0.750, 15: 0.768}
OLMOE_KURT_P50 = {0: 6.55, 7: 6.55, 15: 6.34}
# (top-k mass, top-1 mass) of P(E_b | E_a) for layer pairs 0->7 and 7->15, pooled over 5 domains.
CROSS_MASS = {"olmoe": [(0.314, 0.208), (0.407, 0.309)],
              "mixtral": [(0.304, 0.195), (0.348, 0.230)]}


@needs_real
def test_real_olmoe_table1(real: dict) -> None:
    assert real["_seconds"] < 20
    o = real["models"]["olmoe"]
    assert (o["num_experts"], o["top_k"], o["layer_ids"]) == (64, 8, [0, 7, 15])
    assert sorted(o["per_domain"]) == ["arxiv", "book", "github", "wikipedia"]   # no c4 token file
    for row in o["layers"]:
        layer = row["layer"]
        assert row["occurrences"] == 4 * 208_896
        assert row["cum_hotness_topk"]["p50"] == pytest.approx(OLMOE_CUM_P50[layer], abs=0.03)
        assert row["cum_hotness_topk"]["p50"] < 0.833       # below DeepSeek-V2-Lite's range
        assert row["cum_hotness_topk"]["p50"] > row["uniform"]["cum_hotness_topk_p50"] + 0.25
        assert 0.03 < row["max_hotness_non_topk"]["p50"] < 0.06
        assert row["kurtosis_p50"] == pytest.approx(OLMOE_KURT_P50[layer], abs=0.3)
        assert row["kurtosis_p50"] > 1.8 * row["uniform"]["kurtosis_p50"]
        assert 0.3 < row["uniform"]["cum_hotness_topk_p50"] < 0.45
        assert 2.7 < row["uniform"]["kurtosis_p50"] < 3.5
        assert row["f1"] is None and row["f1_in_sample_mean"] < row["cum_hotness_topk"]["p50"]
        # Domains on their own are more concentrated than the pool (domain shift, on average).
        per = [next(x for x in d["layers"] if x["layer"] == layer)["cum_hotness_topk"]["p50"]
               for d in o["per_domain"].values()]
        assert np.mean(per) > row["cum_hotness_topk"]["p50"] + 0.02


@needs_real
def test_real_domain_shift_and_crosslayer(real: dict) -> None:
    o, x = real["models"]["olmoe"], real["models"]["mixtral"]
    assert (x["num_experts"], x["top_k"], x["layer_ids"]) == (8, 2, [0, 7, 15])
    assert x["domains"] == ["arxiv", "book", "c4", "github", "wikipedia"]
    assert "tulu" in o["domain_js_domains"]
    for m, lo, hi in ((o, 0.25, 0.55), (x, 0.02, 0.1)):
        for row in m["layers"]:
            assert lo < row["domain_js_mean"] < hi
            js = np.array(m["domain_js"][str(row["layer"])])
            assert np.allclose(js, js.T) and np.all(np.diag(js) == 0) and js.max() <= 1
    assert o["summary"]["domain_js_mean"] > 4 * x["summary"]["domain_js_mean"]
    assert all(r["load_imbalance_max_mean"] > 2 for r in o["layers"])
    for key, m in (("olmoe", o), ("mixtral", x)):
        assert [(e["from"], e["to"]) for e in m["crosslayer"]] == [(0, 7), (7, 15)]
        for e, (topk, top1) in zip(m["crosslayer"], CROSS_MASS[key]):
            assert (e["topk_mass"], e["top1_mass"]) == pytest.approx((topk, top1), abs=0.02)
            k, n = m["top_k"], m["num_experts"]
            assert e["pairs"] == 5 * 208_896 * k and e["uniform"] == k / n
            assert e["topk_mass"] > e["topk_mass_independent"] > e["uniform"]
            assert e["top1_mass"] > e["top1_mass_independent"] > e["uniform_top1"]
            assert np.allclose(np.array(e["matrix"]).sum(axis=1), 1, atol=1e-3)
    for key in ("olmoe-sft", "olmoe-dpo"):
        m = real["models"][key]
        assert m["domains"] == ["tulu"] and "per_domain" not in m and "crosslayer" not in m
        assert all(0.03 < v["js"] < 0.2 for v in m["js_vs_base"]["layers"])
    json.dumps({k: v for k, v in real.items() if k != "_seconds"}, allow_nan=False)


@needs_real
def test_real_plots(real: dict, tmp_path: Path) -> None:
    paths = plot_aggregates(real, tmp_path)
    names = {p.name for p in paths}
    for key in ("olmoe", "mixtral"):
        assert {f"real-{key}-{w}.png" for w in ("hotness", "crosslayer", "domain-js")} <= names
    assert all(p.stat().st_size > 10_000 for p in paths)
