"""Routing predictors: Cp (ExpertConfidence), T/Tp (TokenDevice), A/Ap (DeviceNgram), OOV."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.errors import InputError
from sempar.paths import assets_dir
from sempar.placement import Placement
from sempar.predict import (DeviceNgram, EmbeddingOOV, ExpertConfidence, TokenDevice, combine,
                            device_states, load_input_embedding, prediction_accuracy)
from sempar.trace import RoutingTrace, TraceMeta


def make_trace(experts, token_id, vocab: int = 100) -> RoutingTrace:
    experts = np.asarray(experts, np.int16)
    if experts.ndim == 2:                       # [T, k] -> one layer
        experts = experts[:, None, :]
    T, L, k = experts.shape
    N = max(8, int(experts.max()) + 1)
    meta = TraceMeta(model="toy", num_layers=L, num_experts=N, top_k=k, vocab_size=vocab)
    return RoutingTrace(meta, np.asarray(token_id, np.int32), np.arange(T, dtype=np.int32) // 10,
                        np.arange(T, dtype=np.int32) % 10, experts).validate()


def contiguous(L: int, N: int, G: int) -> Placement:
    return Placement(np.tile(np.arange(N), (L, 1)), N, G).validate()


def planted(T: int = 400, L: int = 4, G: int = 4, vocab: int = 40, seed: int = 0):
    """Token v at layer l selects both experts of device (v + l) % G (experts 2g, 2g + 1)."""
    rng = np.random.default_rng(seed)
    tok = rng.integers(0, vocab, T)
    dev = (tok[:, None] + np.arange(L)[None, :]) % G                     # [T, L]
    experts = np.stack([2 * dev + 1, 2 * dev], axis=2)                  # [T, L, 2]
    return make_trace(experts, tok, vocab), dev


# --- ExpertConfidence (Cp) -----------------------------------------------------------------

def test_expert_confidence_probabilities_and_topk():
    # Token 5: {0,1}, {0,1}, {0,2}  -> counts 3, 2, 1 of 6 selections; token 7: {3,2} once.
    t = make_trace([[0, 1], [1, 0], [0, 2], [3, 2]], [5, 5, 5, 7])
    ec = ExpertConfidence().fit(t)
    p = ec.predict_proba(np.array([5, 7, 9]), 0)
    assert p.dtype == np.float32 and p.shape == (3, 8)
    np.testing.assert_allclose(p[0, :4], [1 / 2, 1 / 3, 1 / 6, 0], rtol=1e-6)
    np.testing.assert_allclose(p[1, :4], [0, 0, 0.5, 0.5])
    assert not p[2].any()                                   # unseen token, no mapper
    assert ec.predict(np.array([5, 7, 9]), 0).tolist() == [[0, 1], [2, 3], [-1, -1]]
    assert ec.predict(np.array([5]), 0, k=4).tolist() == [[0, 1, 2, -1]]
    assert ec.nbytes()["expert"] == 2 * 5 and ec.nbytes()["proba"] == 4 * 5
    short = ExpertConfidence(max_entries=2).fit(t)
    np.testing.assert_allclose(short.predict_proba(np.array([5]), 0)[0, :4], [1 / 2, 1 / 3, 0, 0],
                               rtol=1e-6)
    assert short.nbytes()["expert"] == 2 * 4


def test_expert_confidence_recall_on_planted_routing():
    t, _ = planted()
    ec = ExpertConfidence().fit(t.take(np.flatnonzero(t.token_id < 30)))
    seen = t.token_id < 30
    assert 0.5 < seen.mean() < 0.9
    np.testing.assert_allclose(ec.accuracy(t, seen_only=True), 1.0)
    np.testing.assert_allclose(ec.accuracy(t), seen.mean())               # unseen score 0


# --- device states -------------------------------------------------------------------------

def test_device_state_ties_go_to_lowest_device_and_replicas_count_everywhere():
    hosts = contiguous(1, 8, 4).hosts()
    ex = np.array([[[7, 2]], [[1, 0]], [[4, 6]]])             # devices {3,1}, {0,0}, {2,3}
    assert device_states(ex, hosts)[:, 0].tolist() == [1, 0, 2]
    # Device 0 hosts 0..5, device 1 hosts 6, 7, 0, 1, 2, 3: experts 0-3 have two replicas.
    rep = Placement(np.array([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]]), 8, 2).validate()
    ex = np.array([[[0, 6]], [[0, 2]], [[4, 0]]])             # counts (1, 2), (2, 2), (2, 1)
    assert device_states(ex, rep.hosts())[:, 0].tolist() == [1, 0, 0]


# --- TokenDevice (T, Tp) -------------------------------------------------------------------

def test_token_device_recovers_planted_devices():
    t, dev = planted()
    p = contiguous(4, 8, 4)
    td = TokenDevice().fit(t, p)
    d, c = td.predict(t.token_id)
    assert d.dtype == np.int16 and d.shape == (400, 4) and c.dtype == np.float32
    assert (d == dev).all() and (c == 1.0).all()
    L, U = 4, np.unique(t.token_id).size
    assert td.nbytes()["device"] == 2 * L * U
    d, c = td.predict(np.array([1000]))                       # never seen, no mapper
    assert (d == -1).all() and (c == -1).all()


def test_token_device_share_and_state_confidence():
    # Token 3 always sends one expert to device 0 and one to device 1: share 0.5, state 0 always.
    t = make_trace([[0, 2], [1, 3], [2, 0]], [3, 3, 3])
    p = contiguous(1, 8, 4)
    d, c = TokenDevice().fit(t, p).predict(np.array([3]))
    assert d.tolist() == [[0]] and c.tolist() == [[0.5]]
    d, c = TokenDevice(confidence="state").fit(t, p).predict(np.array([3]))
    assert d.tolist() == [[0]] and c.tolist() == [[1.0]]
    with pytest.raises(InputError, match="confidence"):
        TokenDevice(confidence="bogus").fit(t, p)


def test_token_device_counts_replicas_on_every_host():
    # Device 0 hosts 0..5, device 1 hosts 4, 5, 6, 7, 0, 1.
    rep = Placement(np.array([[0, 1, 2, 3, 4, 5, 4, 5, 6, 7, 0, 1]]), 8, 2).validate()
    t = make_trace([[0, 6], [1, 7]], [9, 9])                 # device 1 hosts both, device 0 one
    d, c = TokenDevice().fit(t, rep).predict(np.array([9]))
    assert d.tolist() == [[1]] and c.tolist() == [[1.0]]


# --- DeviceNgram (A, Ap) -------------------------------------------------------------------

def _states_trace(rows):
    """k = 2 selections putting both experts on the listed device at each layer (contiguous)."""
    s = np.asarray(rows)
    return make_trace(np.stack([2 * s, 2 * s + 1], axis=2), np.arange(len(rows)))


def test_ngram_table_backoff_and_bytes():
    rows = [(0, 1, 2)] * 3 + [(1, 1, 3)] * 2 + [(2, 0, 0)]
    t = _states_trace(rows)
    p = contiguous(3, 8, 4)
    ng = DeviceNgram(n=2).fit(t, p)
    assert [[a.size for a in A_l] for A_l in ng.A_] == [[1], [1, 4], [1, 4, 16]]
    assert ng.nbytes()["device"] == 2 * 27
    prev = np.array([[1, 1],      # seen: -> 3 (2/2)
                     [3, 1],      # unseen pair -> back off to (1) at layer 1: {2 x3, 3 x2} -> 2
                     [3, 3],      # unseen pair and unseen (3) -> marginal {2 x3, 3 x2, 0 x1} -> 2
                     [-1, 0],     # unknown older state -> look-back 1: (0) -> 0
                     [2, 0]])     # seen: -> 0
    d, c = ng.predict(prev, 2)
    assert d.tolist() == [3, 2, 2, 0, 0]
    np.testing.assert_allclose(c, [1.0, 0.6, 0.5, 1.0, 1.0])
    d, c = ng.predict(np.zeros((1, 0), np.int64), 2)            # no context: marginal
    assert d.tolist() == [2] and c.tolist() == [0.5]
    d, _ = ng.predict(np.array([[0, 1]]), 1)                     # layer 1: look-back 1 only
    assert d.tolist() == [1]
    with pytest.raises(InputError, match="prev_states"):
        ng.predict(np.array([[4, 0]]), 2)


def test_ngram_and_combination_recover_planted_sequences():
    t, dev = planted()
    p = contiguous(4, 8, 4)
    for n in (1, 2, 3):
        ng = DeviceNgram(n=n).fit(t, p)
        d, c = ng.predict_trace(t)
        assert d.shape == (400, 4) and d.dtype == np.int16 and c.dtype == np.float32
        assert (d[:, 1:] == dev[:, 1:]).all() and (c[:, 1:] == 1.0).all()
        r = prediction_accuracy(t, p, TokenDevice().fit(t, p), ng)
        np.testing.assert_allclose(r["token"], 1.0)
        np.testing.assert_allclose(r["ngram"][1:], 1.0)
        assert r["ngram"][0] < 0.5                                   # layer 0: the marginal only
        np.testing.assert_allclose(r["combined"], 1.0)               # layer 0 taken from T
        assert r["token_chosen"][0] == 1.0 and (r["token_chosen"][1:] == 0).all()  # ties -> A
        np.testing.assert_allclose(r["local"]["oracle"], 1.0)
        assert r["combined_mean"] == 1.0 and r["token_known"] == 1.0


def test_combine_follows_alg3_ties_to_ngram():
    d, c = combine(np.array([1, 2, -1]), np.array([0.9, 0.5, -1.0]),
                   np.array([3, 3, 3]), np.array([0.5, 0.5, 0.2]))
    assert d.tolist() == [1, 3, 3] and np.allclose(c, [0.9, 0.5, 0.2])


def test_prediction_accuracy_rejects_ngram_of_another_placement():
    t, _ = planted()
    p = contiguous(4, 8, 4)
    other = Placement(np.tile(np.arange(8)[::-1], (4, 1)), 8, 4)
    with pytest.raises(InputError, match="another placement"):
        prediction_accuracy(t, p, TokenDevice().fit(t, p), DeviceNgram().fit(t, other))


# --- OOV -----------------------------------------------------------------------------------

def test_oov_maps_to_nearest_known_by_cosine():
    emb = np.array([[1.0, 0.0],       # 0 known
                    [10.0, 10.0],     # 1 known
                    [0.1, 0.1],       # 2: Euclidean-nearest is 0, cosine-nearest is 1
                    [0.9, -0.1],      # 3 -> 0
                    [0.0, 0.0],       # 4 no usable embedding
                    [5.0, 4.0]], np.float32)  # 5 -> 1
    oov = EmbeddingOOV(emb, block=2).fit(np.array([0, 1]))       # block 2: one query per chunk
    assert oov.map(np.array([2, 3, 4, 5, 0, 1, 99, 2])).tolist() == [1, 0, -1, 1, 0, 1, -1, 1]


def test_oov_through_the_predictors():
    t, _ = planted(vocab=10)
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(11, 8)).astype(np.float32)
    emb[10] = 3 * emb[4] + 0.01 * rng.normal(size=8)            # token 10 (never seen) ~ token 4
    p = contiguous(4, 8, 4)
    assert EmbeddingOOV(emb).fit(np.unique(t.token_id)).map(np.array([10, 4])).tolist() == [4, 4]
    d, c = TokenDevice(oov=EmbeddingOOV(emb)).fit(t, p).predict(np.array([10]))
    ref_d, ref_c = TokenDevice().fit(t, p).predict(np.array([4]))
    assert (d == ref_d).all() and (c == ref_c).all() and (d >= 0).all()
    d, c = TokenDevice().fit(t, p).predict(np.array([10]))
    assert (d == -1).all() and (c == -1).all()                  # the stated fallback
    ec = ExpertConfidence(oov=EmbeddingOOV(emb)).fit(t)
    assert ec.predict(np.array([10]), 2).tolist() == ec.predict(np.array([4]), 2).tolist()
    assert (ExpertConfidence().fit(t).predict(np.array([10]), 2) == -1).all()


def test_load_input_embedding(tmp_path):
    emb = load_input_embedding(assets_dir() / "models" / "tiny-moe64")
    assert emb.shape == (8192, 128) and emb.dtype == np.float32 and np.isfinite(emb).all()
    from safetensors.numpy import save_file

    save_file({"transformer.wte.weight": np.arange(6, dtype=np.float32).reshape(3, 2),
               "lm_head.weight": np.zeros((3, 2), np.float32)}, str(tmp_path / "model.safetensors"))
    assert load_input_embedding(tmp_path).tolist() == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(InputError):
        load_input_embedding(tmp_path / "missing")


# --- against a co-clustering solver's own table --------------------------------------------

def test_token_device_agrees_with_semmoe_table():
    from sempar.placement import solve
    from sempar.trace import read_trace, split_by_request

    trace = read_trace(assets_dir() / "traces" / "tiny-moe64.parquet")
    fit, _ = split_by_request(trace, 0.2, seed=0)
    p = solve("semmoe", fit, num_devices=4)
    own = p.token_table
    td = TokenDevice().fit(fit, p)
    assert (td.table_.token_id == own.token_id).all()
    np.testing.assert_allclose(td.table_.confidence, own.confidence, atol=1e-6)
    # The solver's float Cp may break exact ties either way; elsewhere the tables agree.
    agree = td.table_.device == own.device
    assert agree.mean() > 0.98
    conf_top2 = np.sort(_shares(fit, p), axis=2)[:, :, -2:]
    tied = conf_top2[:, :, 0] == conf_top2[:, :, 1]
    assert agree[~tied].all()


def _shares(trace, placement):
    """int64[L, U, G]: activations of each fit token on each device (the reference, dense)."""
    tokens, tok = np.unique(trace.token_id, return_inverse=True)
    hosts = placement.hosts()
    L, G, N = hosts.shape
    out = np.zeros((L, tokens.size, G), np.int64)
    for l in range(L):
        dev_hits = hosts[l].T[trace.experts[:, l].astype(np.int64)].sum(axis=1)   # [T, G]
        np.add.at(out[l], tok, dev_hits)
    return out
