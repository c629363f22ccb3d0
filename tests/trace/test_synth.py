"""The synthetic generator: shapes, determinism, validity, and the calibrated statistics."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.affinity.analysis import analyze_trace
from sempar.errors import InputError
from sempar.trace import read_trace
from sempar.trace.presets import PRESETS
from sempar.trace.synth import BLOCK, SynthGenerator, synthesize


@pytest.mark.parametrize("name", PRESETS.names())
def test_every_preset_has_its_shape_and_is_valid(name):
    shape = PRESETS.get(name)
    t = synthesize(name, 3000, requests=12, seed=3)
    assert t.experts.shape == (3000, shape.num_layers, shape.top_k)
    assert t.meta.num_experts == shape.num_experts
    assert t.meta.shared_experts == shape.shared_experts
    assert t.num_requests == 12
    t.validate()  # ids in range, no duplicate in a top-k, group limit respected
    # every request's positions run 0..len-1 in order
    for r in np.unique(t.request_id)[:3]:
        pos = t.position[t.request_id == r]
        assert np.array_equal(pos, np.arange(pos.size))


def test_preset_shapes_match_the_issue():
    assert [(PRESETS.get(n).num_layers, PRESETS.get(n).num_experts, PRESETS.get(n).top_k)
            for n in ("mixtral-8x7b", "deepseek-v2-lite", "olmoe-1b-7b", "qwen3-30b-a3b",
                      "deepseek-v3")] == [(32, 8, 2), (26, 64, 6), (16, 64, 8), (48, 128, 8),
                                          (58, 256, 8)]
    v3 = PRESETS.get("deepseek-v3")
    assert (v3.shared_experts, v3.num_expert_groups, v3.topk_groups) == (1, 8, 4)
    assert PRESETS.get("deepseek-v2-lite").shared_experts == 2


def test_deepseek_v3_respects_group_limit():
    t = synthesize("deepseek-v3", 2000, seed=5)
    groups = t.experts // 32
    n_groups = np.array([[np.unique(g).size for g in row] for row in groups[:300]])
    assert n_groups.max() <= 4


def test_deterministic_for_a_seed(tmp_path):
    a = synthesize("mixtral-8x7b", BLOCK + 500, seed=7)
    b = synthesize("mixtral-8x7b", BLOCK + 500, seed=7)
    c = synthesize("mixtral-8x7b", BLOCK + 500, seed=8)
    assert np.array_equal(a.experts, b.experts) and np.array_equal(a.token_id, b.token_id)
    assert not np.array_equal(a.experts, c.experts)
    # the streamed file holds exactly the in-memory trace
    SynthGenerator("mixtral-8x7b", BLOCK + 500, seed=7).write(tmp_path / "t.parquet")
    d = read_trace(tmp_path / "t.parquet")
    assert np.array_equal(a.experts, d.experts) and np.array_equal(a.request_id, d.request_id)
    assert d.domains == a.domains and np.array_equal(a.domain, d.domain)


def test_weights_sorted_and_normalised():
    t = synthesize("olmoe-1b-7b", 500, seed=1, weights=True)
    assert t.weights is not None and t.weights.shape == t.experts.shape
    assert np.allclose(t.weights.sum(axis=2), 1.0, atol=1e-5)
    assert (np.diff(t.weights, axis=2) <= 1e-7).all()


@pytest.mark.parametrize("kwargs, msg", [
    (dict(tokens=0), "--tokens"),
    (dict(tokens=100, requests=101), "--requests"),
    (dict(tokens=100, requests=0), "--requests"),
])
def test_bad_arguments(kwargs, msg):
    with pytest.raises(InputError, match=msg):
        SynthGenerator("mixtral-8x7b", **kwargs)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(InputError, match="qwen3-30b-a3b"):
        SynthGenerator("gpt-5", 100)


@pytest.fixture(scope="module")
def olmoe_analysis():
    t = synthesize("olmoe-1b-7b", 120_000, seed=1)
    return analyze_trace(t, devices=8, seed=0).to_json()


def test_table1_in_sem_moe_ranges(olmoe_analysis):
    """Sem-MoE Table 1: p50 cumulative hotness of the static top-k 0.833-0.976 over layers,
    p50 max hotness of the non-top-k about 0.05; A.2: static top-k F1 78.8%."""
    s = olmoe_analysis["summary"]
    p50 = [l["cum_hotness_topk"]["p50"] for l in olmoe_analysis["layers"]]
    assert 0.83 <= min(p50) and max(p50) <= 0.98
    mx = [l["max_hotness_non_topk"]["p50"] for l in olmoe_analysis["layers"]]
    assert 0.02 <= np.mean(mx) <= 0.08
    assert 0.70 <= s["f1_mean"] <= 0.88


def test_lookback_rises_toward_70_percent(olmoe_analysis):
    """Sem-MoE A.2: prediction of layer l+1 from 1..5 look-back layers rises toward ~70%."""
    acc = olmoe_analysis["summary"]["lookback_accuracy"]
    assert all(b > a for a, b in zip(acc, acc[1:]))
    assert acc[4] - acc[0] >= 0.1 and 0.6 <= acc[4] <= 0.85
    dev = olmoe_analysis["summary"]["lookback_accuracy_device"]
    assert dev[4] > dev[0] > 1 / 8  # better than a uniform guess over 8 devices


def test_inter_layer_affinity_and_domains(olmoe_analysis):
    s = olmoe_analysis["summary"]
    assert s["transition_topk_mass_mean"] > 2 * s["transition_uniform"]
    req = olmoe_analysis["requests"]
    assert req["knn_purity"] > 0.8 > 2 * req["knn_chance"]
    assert req["silhouette"] > 0.2


def test_per_batch_long_tail(olmoe_analysis):
    """FSE-DP Fig. 2: the tail is longest for the smallest batches."""
    tail = olmoe_analysis["load_tail"]
    assert set(tail) == {"16", "64", "256", "1024"}
    assert tail["16"]["zero_share"] > tail["64"]["zero_share"] > tail["1024"]["zero_share"]
    assert tail["16"]["max_over_mean"] > tail["1024"]["max_over_mean"] > 1.5
    # uniform routing would leave (1 - 8/64) ** 16 = 0.118 of the experts idle; real OLMoE
    # decoding traces (shared/data/real/small-full-traces) leave 0.32-0.43
    assert tail["16"]["zero_share"] > 2 * (1 - 8 / 64) ** 16
    assert tail["16"]["max_over_mean"] > 4.0


def test_preset_hidden_sizes_one_table():
    """The communication model's hidden sizes (trace.presets) and the serving simulator's model
    dimensions name the same models with the same hidden size."""
    from sempar.serving.dims import DIMS
    from sempar.trace.presets import HIDDEN_SIZES, PRESETS

    assert set(HIDDEN_SIZES) == set(PRESETS.names()) == set(DIMS)
    assert all(DIMS[m].hidden == h for m, h in HIDDEN_SIZES.items())
