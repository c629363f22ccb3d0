"""Affinity statistics (sempar.affinity: token_stats, transitions, requests, load, analysis).

Every figure is checked against an answer computed by hand (or by a closed form / scipy) on tiny
hand-made routings, so that a wrong definition makes a test fail.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats

from sempar.affinity import load, requests, affinity_stats, token_stats, transitions
from sempar.affinity.analysis import analyze_trace
from sempar.errors import InputError
from sempar.trace.schema import RoutingTrace, TraceMeta


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """t-SNE / BLAS on one thread: OpenMP spin-waiting on a busy small box costs seconds per call.

    sklearn is imported first so that its OpenMP runtime is loaded, hence limited, here.
    """
    import sklearn.manifold  # noqa: F401
    import sklearn.metrics  # noqa: F401
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


# ------------------------------------------------------------------------------------------------
# token_stats: Sem-MoE Table 1, hotness, kurtosis
# ------------------------------------------------------------------------------------------------

def test_quantiles_known_and_empty():
    q = token_stats.quantiles(np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert q == {"p25": 2.0, "p50": 3.0, "p75": 4.0}
    q = token_stats.quantiles(np.array([0.0, 1.0]))
    assert q == pytest.approx({"p25": 0.25, "p50": 0.5, "p75": 0.75})
    assert token_stats.quantiles(np.array([])) == {"p25": None, "p50": None, "p75": None}
    assert all(isinstance(v, float) for v in token_stats.quantiles(np.arange(3)).values())


def test_activation_counts_by_hand():
    tok = np.array([0, 1, 0, 2])
    ex = np.array([[0, 1], [2, 3], [1, 3], [0, 2]])
    c = affinity_stats.activation_counts(tok, ex, 4, 4)
    assert c.shape == (4, 4)
    np.testing.assert_array_equal(c, [[1, 2, 0, 1], [0, 0, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]])


def test_request_counts_by_hand():
    req = np.array([1, 0, 1, 1])
    ex = np.array([[0, 1], [2, 3], [1, 3], [0, 2]])
    c = requests.request_counts(req, ex, 3, 4)
    assert c.shape == (3, 4) and c.dtype == np.int64
    np.testing.assert_array_equal(c, [[0, 0, 1, 1], [2, 2, 1, 1], [0, 0, 0, 0]])
    # every layer at once: layer l's block is that layer's counts
    both = requests.request_counts(req, np.stack([ex, ex[:, ::-1] % 2], axis=1), 3, 4)
    assert both.shape == (3, 2, 4)
    np.testing.assert_array_equal(both[:, 0], c)
    np.testing.assert_array_equal(both[:, 1], requests.request_counts(req, ex[:, ::-1] % 2, 3, 4))
    np.testing.assert_array_equal(both[:, 1], [[1, 1, 0, 0], [3, 3, 0, 0], [0, 0, 0, 0]])


def test_top_k_mask_ties_to_lower_expert():
    counts = np.array([[1, 1, 1, 1],      # all tied: the two lowest ids
                       [0, 2, 2, 2],      # tie among 1, 2, 3 -> 1, 2
                       [5, 0, 3, 3],      # 0 first, then tie 2 vs 3 -> 2
                       [0, 0, 0, 9]])     # 3, then tie among zeros -> 0
    m = token_stats.top_k_mask(counts, 2)
    np.testing.assert_array_equal(m, [[1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 1, 0], [1, 0, 0, 1]])
    # k >= N: every expert
    assert token_stats.top_k_mask(counts, 4).all()
    assert token_stats.top_k_mask(counts, 6).shape == (4, 4)


def test_top_k_mask_matches_stable_argsort_reference():
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 4, size=(500, 16))           # many ties
    for k in (1, 2, 5, 15):
        ref = np.zeros_like(counts, dtype=bool)
        np.put_along_axis(ref, np.argsort(-counts, axis=1, kind="stable")[:, :k], True, axis=1)
        np.testing.assert_array_equal(token_stats.top_k_mask(counts, k), ref)
        assert (token_stats.top_k_mask(counts, k).sum(axis=1) == k).all()


def test_hotness_stats_by_hand():
    counts = np.array([[3, 3, 0, 0],        # token A: always [0, 1]
                       [4, 3, 1, 0],        # token B: [0,1] x3, [0,2] x1
                       [1, 2, 3, 0]])
    cum, mx = token_stats.hotness_stats(counts, 2)
    np.testing.assert_allclose(cum, [1.0, 7 / 8, 5 / 6])
    np.testing.assert_allclose(mx, [0.0, 1 / 8, 1 / 6])
    cum1, mx1 = token_stats.hotness_stats(counts, 1)
    np.testing.assert_allclose(cum1, [0.5, 4 / 8, 3 / 6])
    np.testing.assert_allclose(mx1, [0.5, 3 / 8, 2 / 6])


@pytest.mark.parametrize("k", [4, 5])
def test_hotness_stats_k_at_least_n(k):
    counts = np.array([[1, 2, 3, 4], [0, 0, 5, 3]])
    cum, mx = token_stats.hotness_stats(counts, k)
    np.testing.assert_array_equal(cum, [1.0, 1.0])
    np.testing.assert_array_equal(mx, [0.0, 0.0])


def test_pearson_kurtosis_matches_scipy():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 50, size=(200, 64))
    got = token_stats.pearson_kurtosis(counts)
    want = scipy.stats.kurtosis(counts.astype(float), axis=1, fisher=False, bias=True)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    # constant row -> NaN (no warning raised to the caller)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(token_stats.pearson_kurtosis(np.array([[2, 2, 2, 2]]))[0])


@pytest.mark.parametrize("k,N", [(1, 2), (2, 4), (2, 8), (6, 64), (3, 5)])
def test_pearson_kurtosis_closed_form(k, N):
    row = np.zeros((1, N), int)
    row[0, :k] = 7                       # scale does not matter
    p = k / N
    want = (1 - 3 * p * (1 - p)) / (p * (1 - p))
    assert token_stats.pearson_kurtosis(row)[0] == pytest.approx(want, rel=1e-12)
    if (k, N) == (6, 64):
        assert want == pytest.approx(8.77, abs=0.01)   # the docstring's "8.8 for 6 of 64"


def _table1_case():
    """N=4, k=2. Tokens (compact index): A=0, B=1, C=2, D=3, E=4.

    A: fit [0,1]; score [0,1] [1,0]                  -> F1 1, 1;     counts {0:3,1:3}
    B: fit [0,1] [1,0]; score [0,1] [0,2]            -> F1 1, 0.5;   counts {0:4,1:3,2:1}
    C: score only [2,3] [3,2]                        -> not scored;  counts {2:2,3:2}
    D: one fit occurrence [1,2]                      -> not in hotness (1 < 2 occurrences)
    E: fit [2,3] [3,1] (tie 1 vs 2 -> static {3,1}); score [2,3] -> F1 0.5; counts {1:1,2:2,3:3}
    """
    rows = [  # (token, experts, fit)
        (0, [0, 1], True), (0, [0, 1], False), (0, [1, 0], False),
        (1, [0, 1], True), (1, [1, 0], True), (1, [0, 1], False), (1, [0, 2], False),
        (2, [2, 3], False), (2, [3, 2], False),
        (3, [1, 2], True),
        (4, [2, 3], True), (4, [3, 1], True), (4, [2, 3], False),
    ]
    tok = np.array([r[0] for r in rows])
    ex = np.array([r[1] for r in rows])
    fit = np.array([r[2] for r in rows])
    return tok, ex, fit


def test_table1_layer_by_hand():
    tok, ex, fit = _table1_case()
    res = token_stats.table1_layer(tok, ex, fit, n_tokens=5, num_experts=4, min_occurrences=2)
    # scored rows in order: A, A, B, B, E (C never seen in fit; fit rows are not scored)
    np.testing.assert_allclose(res.f1, [1.0, 1.0, 1.0, 0.5, 0.5])
    # hotness over A, B, C, E (token index order; D has a single occurrence)
    np.testing.assert_allclose(res.cum_hotness_topk, [1.0, 7 / 8, 1.0, 5 / 6])
    np.testing.assert_allclose(res.max_hotness_non_topk, [0.0, 1 / 8, 0.0, 1 / 6])
    want_kurt = scipy.stats.kurtosis(np.array([[3, 3, 0, 0], [4, 3, 1, 0], [0, 0, 2, 2],
                                               [0, 1, 2, 3]], float), axis=1, fisher=False)
    np.testing.assert_allclose(res.kurtosis, want_kurt)
    assert res.kurtosis[0] == pytest.approx(1.0)        # closed form, p = 1/2

    s = res.summary(layer=7)
    assert s["layer"] == 7
    assert s["f1"] == {"p25": 0.5, "p50": 1.0, "p75": 1.0}
    assert s["f1_mean"] == pytest.approx(0.8)
    assert s["scored_occurrences"] == 5
    assert s["tokens"] == 4
    assert s["cum_hotness_topk"]["p50"] == pytest.approx(np.median([1, 7 / 8, 1, 5 / 6]))
    assert s["max_hotness_non_topk"]["p50"] == pytest.approx(np.median([0, 1 / 8, 0, 1 / 6]))
    assert s["kurtosis_p50"] == pytest.approx(float(np.median(want_kurt)))


def test_table1_layer_min_occurrences_filters_hotness_only():
    tok, ex, fit = _table1_case()
    res = token_stats.table1_layer(tok, ex, fit, 5, 4, min_occurrences=3)
    np.testing.assert_allclose(res.cum_hotness_topk, [1.0, 7 / 8, 5 / 6])       # A, B, E
    res = token_stats.table1_layer(tok, ex, fit, 5, 4, min_occurrences=4)
    np.testing.assert_allclose(res.cum_hotness_topk, [7 / 8])                    # B only
    np.testing.assert_allclose(res.max_hotness_non_topk, [1 / 8])
    assert res.f1.size == 5                                                       # F1 unchanged
    res = token_stats.table1_layer(tok, ex, fit, 5, 4, min_occurrences=1)
    assert res.cum_hotness_topk.size == 5                                         # D too


def test_table1_layer_token_always_same_experts():
    # token A always routes to [0, 1] (k=2, N=4)
    tok = np.zeros(12, int)
    ex = np.tile([[0, 1]], (12, 1))
    fit = np.arange(12) < 3
    res = token_stats.table1_layer(tok, ex, fit, 1, 4)
    np.testing.assert_array_equal(res.f1, np.ones(9))
    np.testing.assert_array_equal(res.cum_hotness_topk, [1.0])
    np.testing.assert_array_equal(res.max_hotness_non_topk, [0.0])


def test_table1_layer_nothing_scored():
    tok = np.array([0, 1, 2, 3])
    ex = np.array([[0, 1], [1, 2], [2, 3], [0, 3]])
    fit = np.array([True, True, False, False])    # tokens 2 and 3 never seen in fit
    res = token_stats.table1_layer(tok, ex, fit, 4, 4)
    assert res.f1.size == 0
    s = res.summary(0)
    assert s["f1"] == {"p25": None, "p50": None, "p75": None}
    assert s["f1_mean"] is None and s["scored_occurrences"] == 0
    assert s["tokens"] == 0 and s["kurtosis_p50"] is None


# ------------------------------------------------------------------------------------------------
# transitions: device states, look-back prediction, transition matrices
# ------------------------------------------------------------------------------------------------

def test_contiguous_devices():
    assert transitions.contiguous_devices(8, 4).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert transitions.contiguous_devices(8, 1).tolist() == [0] * 8
    assert transitions.contiguous_devices(8, 8).tolist() == list(range(8))
    assert transitions.contiguous_devices(64, 8).tolist() == list(np.repeat(np.arange(8), 8))


def test_device_states_majority_and_ties():
    dev = transitions.contiguous_devices(8, 4)                     # [0,0,1,1,2,2,3,3]

    def states(e, ties="top1"):
        return affinity_stats.device_states(e, affinity_stats.layout_hosts(dev, 4, e.shape[1]), ties)

    # k=2: a tie between two devices always goes to the top-1 expert's device
    e2 = np.array([[[2, 6], [6, 2]], [[0, 1], [7, 0]]])            # [T=2, L=2, k=2]
    np.testing.assert_array_equal(states(e2), [[1, 3], [0, 3]])
    np.testing.assert_array_equal(states(e2, "lowest"), [[1, 1], [0, 0]])
    # k=3: majority wins even against the top-1's device
    e3 = np.array([[[0, 4, 5]], [[4, 0, 1]], [[7, 6, 2]]])
    np.testing.assert_array_equal(states(e3), [[2], [0], [3]])
    # k=4: 2-1-1 majority; 2-2 tie with the top-1 among the tied -> top-1's device
    e4 = np.array([[[0, 2, 4, 5]], [[6, 0, 1, 7]], [[0, 1, 6, 7]]])
    np.testing.assert_array_equal(states(e4), [[2], [3], [0]])
    np.testing.assert_array_equal(states(e4, "lowest"), [[2], [0], [0]])
    # k=5: tie between devices 1 and 2 and the top-1 (device 0) is not among them -> lowest id
    e5 = np.array([[[0, 2, 3, 4, 5]], [[7, 4, 5, 2, 3]]])
    np.testing.assert_array_equal(states(e5), [[1], [1]])
    assert states(e5).dtype == np.int16
    with pytest.raises(InputError, match="ties"):
        states(e5, "first")


def test_lookback_deterministic_chain_is_perfect():
    rng = np.random.default_rng(1)
    T, L, N = 3000, 8, 8
    e = np.empty((T, L, 1), np.int64)
    e[:, 0, 0] = rng.integers(0, N, T)
    for l in range(1, L):
        e[:, l, 0] = (e[:, l - 1, 0] + 1) % N
    fit = rng.random(T) < 0.25
    acc = transitions.lookback_accuracy(e[:, :, 0], e, N, fit)
    assert acc == [1.0] * 5
    # same with k=2 targets fixed by the top-1 state: [a, a+4]
    e2 = np.concatenate([e, (e + 4) % N], axis=2)
    assert transitions.lookback_accuracy(e2[:, :, 0], e2, N, fit) == [1.0] * 5
    # short traces: L=2 still scores layer 1 with every n backing off to n=1
    assert transitions.lookback_accuracy(e[:, :2, 0], e[:, :2], N, fit) == [1.0] * 5


def test_lookback_independent_uniform_is_k_over_n():
    rng = np.random.default_rng(2)
    T, L, N, k = 20000, 7, 8, 2
    e = np.argsort(rng.random((T, L, N)), axis=2)[:, :, :k]       # k distinct, uniform
    fit = rng.random(T) < 0.25
    acc = transitions.lookback_accuracy(e[:, :, 0], e, N, fit)
    assert len(acc) == 5
    for a in acc:
        assert a == pytest.approx(k / N, abs=0.02)


def test_lookback_backoff_by_hand():
    """L=3, k=1: only layer 2 is scored; contexts are states at layers 1 (n=1) and 0, 1 (n=2).

    fit rows (s0, s1) -> target: (0,0)->1 x1, (1,0)->2 x2, (1,1)->3 x4 (marginal predicts 3)
    scored rows:
      (0,0)->1: n=1 ctx s1=0 predicts 2 (miss); n=2 ctx (0,0) predicts 1 (hit)
      (2,0)->2: n=1 predicts 2 (hit); n=2 ctx (2,0) unseen, backs off to n=1 (hit), not to 3
      (3,3)->3: s1=3 unseen at every n: marginal predicts 3 (hit)
      (0,2)->0: unseen -> marginal 3 (miss)
    n=1: 2/4; n>=2: 3/4 (n = 3, 4, 5 cannot look further back than layer 0).
    """
    fit_rows = [((0, 0), 1)] + [((1, 0), 2)] * 2 + [((1, 1), 3)] * 4
    score_rows = [((0, 0), 1), ((2, 0), 2), ((3, 3), 3), ((0, 2), 0)]
    rows = fit_rows + score_rows
    states = np.array([[s0, s1, 0] for (s0, s1), _ in rows])
    targets = np.zeros((len(rows), 3, 1), np.int64)
    targets[:, 2, 0] = [t for _, t in rows]
    fit = np.arange(len(rows)) < len(fit_rows)
    acc = transitions.lookback_accuracy(states, targets, 4, fit)
    assert acc == pytest.approx([0.5, 0.75, 0.75, 0.75, 0.75])


def test_lookback_ties_to_lower_item_and_partial_hits():
    # L=2, one context (state 0): fit targets 2 and 1 once each -> predicts 1 (lower id)
    states = np.zeros((3, 2), np.int64)
    targets = np.zeros((3, 2, 1), np.int64)
    targets[:, 1, 0] = [2, 1, 1]
    fit = np.array([True, True, False])
    assert transitions.lookback_accuracy(states, targets, 4, fit) == [1.0] * 5
    targets[2, 1, 0] = 2
    assert transitions.lookback_accuracy(states, targets, 4, fit) == [0.0] * 5
    # k=2: fit [0,1] x2, [2,3] x1 -> predicts {0,1}; scored [1,2] -> 1/2
    states = np.zeros((4, 2), np.int64)
    targets = np.zeros((4, 2, 2), np.int64)
    targets[:, 1] = [[0, 1], [1, 0], [2, 3], [1, 2]]
    fit = np.array([True, True, True, False])
    assert transitions.lookback_accuracy(states, targets, 4, fit) == [0.5] * 5


def test_lookback_large_alphabet_bitsets():
    # items >= 64 exercise more than one bit-set word
    rng = np.random.default_rng(5)
    T, N = 2000, 130
    s0 = rng.integers(0, N, T)
    e = np.stack([s0, (s0 + 67) % N], axis=1)[:, :, None]          # [T, 2, 1]
    fit = rng.random(T) < 0.5
    assert transitions.lookback_accuracy(e[:, :, 0], e, N, fit) == [1.0] * 5


def test_lookback_degenerate_inputs_give_none():
    e = np.zeros((10, 1, 1), np.int64)
    fit = np.arange(10) < 3
    assert transitions.lookback_accuracy(e[:, :, 0], e, 4, fit) == [None] * 5       # L == 1
    e = np.zeros((10, 3, 1), np.int64)
    assert transitions.lookback_accuracy(e[:, :, 0], e, 4, np.ones(10, bool)) == [None] * 5
    assert transitions.lookback_accuracy(e[:, :, 0], e, 4, np.zeros(10, bool)) == [None] * 5
    assert transitions.lookback_accuracy(e[:, :, 0], e, 4, fit, max_lookback=3) == [1.0] * 3


def test_pair_counts_and_transition_matrix_by_hand():
    a = np.array([[0], [0], [1]])
    b = np.array([[1], [2], [1]])
    np.testing.assert_array_equal(transitions.pair_counts(a, b, 3),
                                  [[0, 1, 1], [0, 1, 0], [0, 0, 0]])
    P = transitions.transition_matrix(a, b, 3)
    np.testing.assert_allclose(P, [[0, 0.5, 0.5], [0, 1, 0], [0, 0, 0]])
    # k=2: all k x k pairs of a token's selections
    a2 = np.array([[0, 1], [1, 2]])
    b2 = np.array([[2, 3], [3, 0]])
    np.testing.assert_array_equal(transitions.pair_counts(a2, b2, 4),
                                  [[0, 0, 1, 1], [1, 0, 1, 2], [1, 0, 0, 1], [0, 0, 0, 0]])
    P2 = transitions.transition_matrix(a2, b2, 4)
    np.testing.assert_allclose(P2[1], [0.25, 0, 0.25, 0.5])
    np.testing.assert_allclose(P2[3], 0.0)


def test_transition_matrix_rows_sum_to_one_with_traffic():
    rng = np.random.default_rng(4)
    a = np.argsort(rng.random((300, 16)), axis=1)[:, :2]
    a[a == 5] = 4                                                 # expert 5: no traffic in a
    a[:, 1] = np.where(a[:, 0] == a[:, 1], (a[:, 0] + 7) % 16, a[:, 1])
    a[a == 5] = 6
    b = np.argsort(rng.random((300, 16)), axis=1)[:, :2]
    P = transitions.transition_matrix(a, b, 16)
    sums = P.sum(axis=1)
    traffic = np.isin(np.arange(16), a)
    np.testing.assert_allclose(sums[traffic], 1.0)
    assert sums[5] == 0.0 and not traffic[5]


def test_topk_mass():
    # by hand: k=1, rows [3,1,0] and [1,1,1]: traffic-weighted (3 + 1) / 7
    c = np.array([[3, 1, 0], [1, 1, 1], [0, 0, 0]])
    assert transitions.topk_mass(c, 1) == pytest.approx(4 / 7)
    assert transitions.topk_mass(c, 1, row_weight=np.array([1.0, 1.0, 5.0])) == pytest.approx(
        (3 / 4 + 1 / 3) / 2)
    assert transitions.topk_mass(c, 3) == pytest.approx(1.0)
    assert transitions.topk_mass(c, 5) == pytest.approx(1.0)
    assert math.isnan(transitions.topk_mass(np.zeros((2, 2)), 1))

    rng = np.random.default_rng(6)
    N = 8
    # deterministic k=1 mapping i -> (3i + 1) % N
    a = rng.integers(0, N, (5000, 1))
    b = (3 * a + 1) % N
    assert transitions.topk_mass(transitions.pair_counts(a, b, N), 1) == pytest.approx(1.0)
    # deterministic k=2 mapping of expert pairs {2g, 2g+1} -> {2g', 2g'+1}, g' = (g + 1) % 4
    g = rng.integers(0, 4, 5000)
    a2 = np.stack([2 * g, 2 * g + 1], axis=1)
    g2 = (g + 1) % 4
    b2 = np.stack([2 * g2 + 1, 2 * g2], axis=1)
    assert transitions.topk_mass(transitions.pair_counts(a2, b2, N), 2) == pytest.approx(1.0)
    # independent uniform routing: k / N
    k = 2
    a3 = np.argsort(rng.random((50000, N)), axis=1)[:, :k]
    b3 = np.argsort(rng.random((50000, N)), axis=1)[:, :k]
    assert transitions.topk_mass(transitions.pair_counts(a3, b3, N), k) == pytest.approx(
        k / N, abs=0.01)


# ------------------------------------------------------------------------------------------------
# requests: activation vectors and their embedding
# ------------------------------------------------------------------------------------------------

def test_activation_vectors_by_hand():
    rid = np.array([5, 3, 5])
    ex = np.array([[[0, 1], [2, 3]],          # request 5
                   [[1, 3], [0, 1]],          # request 3
                   [[0, 2], [2, 3]]])         # request 5
    reqs, vec = requests.activation_vectors(rid, ex, 4)
    assert reqs.tolist() == [3, 5]
    assert vec.shape == (2, 8)
    np.testing.assert_allclose(vec[0], [0, .5, 0, .5, .5, .5, 0, 0])
    np.testing.assert_allclose(vec[1], [.5, .25, .25, 0, 0, 0, .5, .5])


def test_activation_vectors_blocks_sum_to_one():
    rng = np.random.default_rng(7)
    T, L, N, k = 500, 4, 16, 3
    ex = np.argsort(rng.random((T, L, N)), axis=2)[:, :, :k]
    rid = rng.integers(0, 30, T)
    reqs, vec = requests.activation_vectors(rid, ex, N)
    assert reqs.tolist() == sorted(set(rid.tolist()))
    np.testing.assert_allclose(vec.reshape(reqs.size, L, N).sum(axis=2), 1.0)


def _two_domain_vectors(n0: int, n1: int, seed: int = 0):
    """Activation-like vectors: domain 0 uses experts 0..3, domain 1 experts 4..7 (L=3, N=8)."""
    rng = np.random.default_rng(seed)
    L, N = 3, 8
    R = n0 + n1
    dom = np.array([0] * n0 + [1] * n1, np.int16)
    v = np.full((R, L, N), 0.0)
    for r in range(R):
        lo = 0 if dom[r] == 0 else 4
        v[r, :, lo:lo + 4] = rng.dirichlet(np.full(4, 20.0), size=L)
    v += rng.random(v.shape) * 0.01
    v /= v.sum(axis=2, keepdims=True)
    return np.arange(R, dtype=np.int64), dom, v.reshape(R, L * N)


def test_embed_requests_separates_two_domains():
    rid, dom, vec = _two_domain_vectors(20, 20)
    emb = requests.embed_requests(rid, dom, vec, seed=0)
    assert emb.xy.shape == (40, 2) and np.isfinite(emb.xy).all()
    assert emb.knn_purity == 1.0
    assert emb.silhouette > 0.5
    assert emb.knn_chance == pytest.approx(0.5)
    s = emb.summary(["code", "math"])
    assert s == {"requests": 40, "domains": ["code", "math"], "silhouette": emb.silhouette,
                 "knn_purity": 1.0, "knn_chance": pytest.approx(0.5)}


def test_embed_requests_chance_and_unlabelled():
    rid, dom, vec = _two_domain_vectors(10, 30, seed=1)
    dom = dom.copy()
    dom[:2] = -1                                 # two unknown-domain requests: not counted
    emb = requests.embed_requests(rid, dom, vec, seed=0)
    assert emb.knn_chance == pytest.approx((8 / 38) ** 2 + (30 / 38) ** 2)
    assert emb.knn_purity == 1.0
    assert emb.xy.shape == (40, 2)


def test_embed_requests_degenerate():
    rid, dom, vec = _two_domain_vectors(1, 1)
    emb = requests.embed_requests(rid, dom, vec)
    assert (emb.silhouette, emb.knn_purity, emb.knn_chance) == (None, None, None)
    assert emb.xy.shape == (2, 2)
    # a single domain: no separation figures
    rid, dom, vec = _two_domain_vectors(12, 0)
    emb = requests.embed_requests(rid, dom, vec)
    assert (emb.silhouette, emb.knn_purity, emb.knn_chance) == (None, None, None)
    assert emb.xy.shape == (12, 2)


# ------------------------------------------------------------------------------------------------
# load: per-batch load and its long tail
# ------------------------------------------------------------------------------------------------

def test_batch_load_by_hand():
    ex = np.array([[[0], [1]], [[0], [2]], [[3], [1]], [[0], [1]], [[2], [2]]])   # T=5, L=2, k=1
    c = load.batch_load(ex, 4, 2)
    assert c.shape == (2, 2, 4)                       # 2 full batches, the 5th token dropped
    np.testing.assert_array_equal(c[0], [[2, 0, 0, 0], [0, 1, 1, 0]])
    np.testing.assert_array_equal(c[1], [[1, 0, 0, 1], [0, 2, 0, 0]])
    assert load.batch_load(ex, 4, 6).shape == (0, 2, 4)
    # k=2: counts are selections, so each batch-layer sums to B * k
    ex2 = np.array([[[0, 1]], [[1, 2]], [[1, 3]]])
    np.testing.assert_array_equal(load.batch_load(ex2, 4, 3)[0, 0], [1, 3, 1, 1])


def test_batch_load_max_batches_spread_evenly():
    T = 100
    ex = (np.arange(T) // 10 % 4)[:, None, None]          # batch i of 10 tokens -> expert i % 4
    c = load.batch_load(ex, 4, 10, max_batches=4)
    assert c.shape == (4, 1, 4)
    # picks linspace(0, 9, 4) -> batches 0, 3, 6, 9 -> experts 0, 3, 2, 1
    np.testing.assert_array_equal(c[:, 0].argmax(axis=1), [0, 3, 2, 1])
    assert (c.sum(axis=(1, 2)) == 10).all()


def test_long_tail_all_on_one_expert():
    T, L, N = 300, 2, 8
    ex = np.zeros((T, L, 1), np.int16)
    tail = load.long_tail(ex, N)
    assert sorted(tail) == [16, 64, 256]                  # 1024 > T: skipped
    for B, d in tail.items():
        assert d["batches"] == T // B
        assert d["max_over_mean"] == pytest.approx(8.0)
        assert d["zero_share"] == pytest.approx(7 / 8)
        assert d["top10_share"] == pytest.approx(1.0)
        assert d["single_token_share"] == 0.0
        assert d["sorted_load"] == pytest.approx([float(B)] + [0.0] * 7)
    assert load.long_tail(ex[:10], N) == {}


def test_long_tail_by_hand():
    # B=4, N=4, k=1, one layer: batch 0 -> [2,1,1,0]; batch 1 -> [1,1,1,1]
    ex = np.array([0, 0, 1, 2, 0, 1, 2, 3])[:, None, None]
    d = load.long_tail(ex, 4, batch_sizes=(4, 8, 16))
    assert sorted(d) == [4, 8]
    d4 = d[4]
    assert d4["batches"] == 2
    assert d4["sorted_load"] == pytest.approx([1.5, 1.0, 1.0, 0.5])
    assert d4["max_over_mean"] == pytest.approx((2 / 1 + 1 / 1) / 2)
    assert d4["zero_share"] == pytest.approx(1 / 8)
    assert d4["top10_share"] == pytest.approx((2 / 4 + 1 / 4) / 2)          # n_top = 1 of 4
    assert d4["single_token_share"] == pytest.approx((2 / 3 + 4 / 4) / 2)
    d8 = d[8]                                                             # [3, 2, 2, 1]
    assert d8["max_over_mean"] == pytest.approx(1.5)
    assert d8["single_token_share"] == pytest.approx(1 / 4)
    assert d8["zero_share"] == 0.0


def test_long_tail_round_robin_64_experts():
    # every expert gets exactly one token per batch of 64; the hottest 10% are round(6.4) = 6
    ex = (np.arange(256) % 64)[:, None, None]
    d = load.long_tail(ex, 64, batch_sizes=(64,))[64]
    assert d["batches"] == 4
    assert d["top10_share"] == pytest.approx(6 / 64)
    assert d["max_over_mean"] == pytest.approx(1.0)
    assert d["zero_share"] == 0.0
    assert d["single_token_share"] == 1.0


# ------------------------------------------------------------------------------------------------
# analysis.analyze_trace: the JSON contract
# ------------------------------------------------------------------------------------------------

def _static_trace(T: int = 400, R: int = 20, L: int = 6, N: int = 8, k: int = 2,
                  sizes: list[int] | None = None, seed: int = 0) -> RoutingTrace:
    """Perfectly static routing: token v selects [a, a+4] at layer 0 with a = v % N and
    a -> a + 1 from one layer to the next. Requests alternate between two domains, which use
    disjoint vocabularies (0..9 and 10..19)."""
    rng = np.random.default_rng(seed)
    if sizes is None:
        sizes = [T // R] * R
    T = sum(sizes)
    request_id = np.repeat(np.arange(len(sizes)), sizes).astype(np.int32)
    position = np.concatenate([np.arange(s) for s in sizes]).astype(np.int32)
    domain = (request_id % 2).astype(np.int16)
    token_id = (rng.integers(0, 10, T) + 10 * domain).astype(np.int32)
    a = (token_id[:, None] + np.arange(L)[None, :]) % N                   # [T, L]
    experts = np.stack([a, (a + N // 2) % N], axis=2)[:, :, :k].astype(np.int16)
    meta = TraceMeta(model="toy", num_layers=L, num_experts=N, top_k=k, vocab_size=100)
    return RoutingTrace(meta=meta, token_id=token_id, request_id=request_id, position=position,
                        experts=experts, domain=domain, domains=["code", "math"]).validate()


def _random_trace(T: int = 400, R: int = 20, L: int = 6, N: int = 8, k: int = 2,
                  seed: int = 0, vocab: int = 50) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    request_id = np.repeat(np.arange(R), T // R).astype(np.int32)
    experts = np.argsort(rng.random((T, L, N)), axis=2)[:, :, :k].astype(np.int16)
    meta = TraceMeta(model="toy", num_layers=L, num_experts=N, top_k=k, vocab_size=vocab)
    return RoutingTrace(meta=meta, token_id=rng.integers(0, vocab, T).astype(np.int32),
                        request_id=request_id,
                        position=np.tile(np.arange(T // R), R).astype(np.int32),
                        experts=experts, domain=(request_id % 2).astype(np.int16),
                        domains=["code", "math"]).validate()


LAYER_KEYS = {"layer", "f1", "cum_hotness_topk", "max_hotness_non_topk", "kurtosis_p50"}
SUMMARY_KEYS = {"f1_p50_mean", "cum_hotness_topk_p50_mean", "max_hotness_non_topk_p50_mean",
                "lookback_accuracy"}


def test_analyze_trace_json_contract():
    import json

    trace = _random_trace()
    res = analyze_trace(trace, devices=4, seed=0)
    j = res.to_json()
    json.dumps(j, allow_nan=False)                    # plain JSON, no NaN
    assert {"layers", "summary", "trace", "requests", "load_tail", "sampled"} <= set(j)
    assert len(j["layers"]) == 6
    for i, layer in enumerate(j["layers"]):
        assert LAYER_KEYS <= set(layer)
        assert layer["layer"] == i
        for key in ("f1", "cum_hotness_topk", "max_hotness_non_topk"):
            assert set(layer[key]) == {"p25", "p50", "p75"}
            assert all(isinstance(v, float) for v in layer[key].values())
        assert layer["f1"]["p25"] <= layer["f1"]["p50"] <= layer["f1"]["p75"]
        # F1 values are multiples of 1/k
        assert layer["f1"]["p50"] * 2 == pytest.approx(round(layer["f1"]["p50"] * 2))
    s = j["summary"]
    assert SUMMARY_KEYS <= set(s)
    assert len(s["lookback_accuracy"]) == 5 and len(s["lookback_accuracy_device"]) == 5
    assert all(0.0 <= a <= 1.0 for a in s["lookback_accuracy"])
    assert s["devices"] == 4
    assert s["transition_uniform"] == pytest.approx(0.25)
    assert s["f1_p50_mean"] == pytest.approx(np.mean([l["f1"]["p50"] for l in j["layers"]]))
    assert j["trace"]["tokens"] == 400 and j["trace"]["domain_names"] == ["code", "math"]
    assert j["requests"]["requests"] == 20 and j["requests"]["domains"] == ["code", "math"]
    assert set(j["load_tail"]) == {"16", "64", "256"}
    assert "sorted_load" not in j["load_tail"]["16"]
    assert j["sampled"] == {}
    assert res.transition_layers == [(0, 1), (2, 3), (4, 5)]
    assert [m.shape for m in res.transition_expert] == [(8, 8)] * 3
    assert [m.shape for m in res.transition_device] == [(4, 4)] * 3
    assert len(res.topk_mass) == 5


def test_analyze_trace_static_routing_is_perfect():
    res = analyze_trace(_static_trace(), devices=4, seed=0)
    j = res.to_json()
    s = j["summary"]
    assert s["f1_p50_mean"] == 1.0
    assert s["f1_mean"] == 1.0
    assert s["cum_hotness_topk_p50_mean"] == 1.0
    assert s["max_hotness_non_topk_p50_mean"] == 0.0
    assert s["lookback_accuracy"] == [1.0] * 5
    # device level (G=4, devices a // 2): the device at l-1 leaves a's parity open, so n=1 cannot
    # be perfect; the devices at l-2 and l-1 fix a, so n >= 2 is
    assert s["lookback_accuracy_device"][0] < 0.9
    assert s["lookback_accuracy_device"][1:] == [1.0] * 4
    assert s["transition_topk_mass_mean"] == pytest.approx(1.0)
    p = 2 / 8
    assert s["kurtosis_p50_mean"] == pytest.approx((1 - 3 * p * (1 - p)) / (p * (1 - p)))
    for layer in j["layers"]:
        assert layer["f1"] == {"p25": 1.0, "p50": 1.0, "p75": 1.0}
        assert layer["cum_hotness_topk"]["p25"] == 1.0
        assert layer["max_hotness_non_topk"]["p75"] == 0.0
        assert layer["tokens"] == 20
    assert j["requests"]["knn_chance"] == pytest.approx(0.5)
    # one device per expert: the device state is the top-1 expert, perfect at every n
    j8 = analyze_trace(_static_trace(), devices=8, seed=0, embed=False).to_json()
    assert j8["summary"]["lookback_accuracy_device"] == [1.0] * 5


def test_analyze_trace_random_routing_lookback_near_uniform():
    res = analyze_trace(_random_trace(T=4000, R=40, vocab=200, seed=3), devices=2, seed=1,
                        embed=False)
    j = res.to_json()
    assert j["requests"] is None
    for a in j["summary"]["lookback_accuracy"]:
        assert a == pytest.approx(2 / 8, abs=0.05)
    assert j["summary"]["f1_p50_mean"] < 1.0


@pytest.mark.parametrize("devices", [0, -1, 9])
def test_analyze_trace_rejects_bad_devices(devices):
    with pytest.raises(InputError, match="--ep"):
        analyze_trace(_random_trace(), devices=devices)


def test_analyze_trace_accepts_device_bounds():
    t = _random_trace()
    assert analyze_trace(t, devices=1, embed=False).to_json()["summary"]["devices"] == 1
    assert analyze_trace(t, devices=8, embed=False).to_json()["summary"]["devices"] == 8


def test_analyze_trace_rejects_tiny_trace():
    t = _random_trace(T=20, R=4)
    with pytest.raises(InputError, match="too few"):
        analyze_trace(t.take(np.arange(7)))
    analyze_trace(t.take(np.arange(8)), embed=False)          # 8 tokens are enough


def test_analyze_trace_max_tokens_keeps_whole_requests():
    sizes = [10 + 3 * i for i in range(20)]                  # every request size distinct
    trace = _static_trace(sizes=sizes)
    res = analyze_trace(trace, devices=4, seed=0, max_tokens=200)
    j = res.to_json()
    smp = j["sampled"]
    assert smp["from_tokens"] == sum(sizes)
    assert "note" in smp
    kept = res.embedding.request_id.tolist()
    assert 0 < len(kept) < 20
    assert smp["tokens"] == sum(sizes[r] for r in kept)        # whole requests only
    assert smp["tokens"] <= 1.5 * 200
    assert j["requests"]["requests"] == len(kept)
    # no subsampling when the trace fits
    assert analyze_trace(trace, devices=4, max_tokens=10_000, embed=False).to_json()["sampled"] == {}


def test_analyze_trace_single_layer():
    t = _random_trace(L=1)
    j = analyze_trace(t, devices=2, embed=False).to_json()
    assert j["summary"]["lookback_accuracy"] == [None] * 5
    assert j["summary"]["transition_topk_mass_mean"] is None
    assert len(j["layers"]) == 1


def test_analyze_trace_no_domain_skips_embedding():
    t = _random_trace()
    t = RoutingTrace(meta=t.meta, token_id=t.token_id, request_id=t.request_id,
                     position=t.position, experts=t.experts)
    res = analyze_trace(t, devices=2)
    assert res.embedding is None and res.to_json()["requests"] is None


def test_analyze_trace_nothing_scored_summary_is_null():
    """Every token id is distinct, so no scored occurrence was seen in the fit rows."""
    import json

    t = _random_trace(T=400, vocab=400)
    t.token_id = np.arange(400, dtype=np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        j = analyze_trace(t, devices=2, embed=False).to_json()
    assert j["summary"]["f1_p50_mean"] is None
    assert all(l["f1_mean"] is None for l in j["layers"])
    assert j["summary"]["f1_mean"] is None
    json.dumps(j, allow_nan=False)


@pytest.mark.parametrize("chunk_bins", [1, 3 * 8, 1 << 18])
def test_affinity_counts_match_dense_counts(monkeypatch, chunk_bins):
    """AffinityStats.counts (chunked bincounts into reused buffers) equals the dense table,
    whatever the chunking; a forgotten layer counts again to the same table."""
    from conftest import build_trace

    monkeypatch.setattr(affinity_stats, "CHUNK_BINS", chunk_bins)
    trace = build_trace(T=2000, R=40, L=3, N=8, k=2, vocab=60)
    st = affinity_stats.AffinityStats(trace)
    tok = np.searchsorted(st.tokens, trace.token_id)
    for l in range(3):
        ref = affinity_stats.activation_counts(tok, trace.experts[:, l].astype(np.int64), st.U, 8)
        C = st.counts(l)
        assert C.has_sorted_indices and C.dtype == np.float32
        np.testing.assert_array_equal(C.toarray(), ref)
        st.forget(l)
        assert l not in st._cache
        np.testing.assert_array_equal(st.counts(l).toarray(), ref)


def test_device_share_cached_equals_from_occurrences():
    """device_share from the cached counts (a sparse product) and from the occurrences (no
    cache) agree exactly, so the token tables do not depend on the cache."""
    from conftest import build_trace

    trace = build_trace(T=2000, R=40, L=3, N=8, k=2, vocab=60)
    cached, bare = affinity_stats.AffinityStats(trace), affinity_stats.AffinityStats(trace, 0)
    dev = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    for l in range(3):
        cached.counts(l)
        assert l in cached._cache and not bare._cache
        a, b = cached.device_share(l, dev, 3), bare.device_share(l, dev, 3)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a.sum(axis=1), 1.0)
