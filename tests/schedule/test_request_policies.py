"""Attention-DP request scheduling (Sem-MoE App. B Alg. 2, and our `balanced`): properties."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.errors import InputError
from sempar.predict.token_table import TokenTable
from sempar.schedule.request_eval import evaluate_policies, rank_figures, reorder_requests
from sempar.schedule.requests import REQUEST_POLICIES, make_policy, request_arrays, score_matrix
from sempar.schedule.homes import home_from_ranks


def random_table(rng, G: int, U: int = 300, L: int = 3, vocab: int = 1000) -> TokenTable:
    tok = np.sort(rng.choice(vocab, U, replace=False))
    return TokenTable(tok, rng.integers(0, G, (L, U)), rng.random((L, U)).astype(np.float32))


def random_requests(rng, R: int, vocab: int = 1200, lo: int = 1, hi: int = 60):
    """(token_ids int64[T], offsets int64[R + 1]); ids past the table's range included."""
    lens = rng.integers(lo, hi, R)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return rng.integers(0, vocab, off[-1]).astype(np.int64), off


def two_domain_table(G: int) -> TokenTable:
    """Tokens 0..99 (domain A) say rank 0 at every layer, tokens 100..199 (domain B) rank 1."""
    tok = np.arange(200)
    dev = np.where(tok < 100, 0, 1)[None, :].repeat(4, axis=0)
    return TokenTable(tok, dev, np.full(dev.shape, 0.9, np.float32))


def stream(policy, tok, off, window=None):
    """Streaming form: submit each request; complete request i - window before request i."""
    ranks = []
    for i in range(off.size - 1):
        if window is not None and i >= window:
            j = i - window
            policy.complete(ranks[j], int(off[j + 1] - off[j]))
        ranks.append(policy.submit(tok[off[i]:off[i + 1]]))
    return np.array(ranks)


# -- Alg. 2 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("G", [1, 2, 5, 8])
def test_alg2_gives_every_rank_one_request_per_round(G):
    rng = np.random.default_rng(G)
    tok, off = random_requests(rng, 203)
    ranks = make_policy("alg2", G, random_table(rng, G)).assign(tok, off)
    full = ranks.size // G * G
    rounds = ranks[:full].reshape(-1, G)
    assert (np.sort(rounds, axis=1) == np.arange(G)).all()
    tail = ranks[full:]
    assert np.unique(tail).size == tail.size           # the partial round: distinct ranks
    assert rank_figures(ranks, np.diff(off), G, 8 * G)["round_count_spread"] == 0


def test_alg2_matches_a_literal_reading_of_the_paper():
    """Alg. 2 line by line, with dev_score summed by looking every token and layer up in T."""
    rng = np.random.default_rng(7)
    G = 4
    table = random_table(rng, G)
    tok, off = random_requests(rng, 57)
    where = {int(u): i for i, u in enumerate(table.token_id)}
    mask = np.ones(G, bool)
    expect, scores = [], []
    for r in range(off.size - 1):
        score = np.zeros(G)
        for u in tok[off[r]:off[r + 1]]:
            if int(u) in where:                          # unknown tokens contribute nothing
                for l in range(table.num_layers):
                    score[table.device[l, where[int(u)]]] += table.confidence[l, where[int(u)]]
        scores.append(score.copy())
        score[~mask] = -np.inf
        g = int(np.argmax(score))
        mask[g] = False
        if not mask.any():
            mask[:] = True
        expect.append(g)
    pol = make_policy("alg2", G, table)
    np.testing.assert_allclose(pol.scores(tok, off), np.array(scores), rtol=1e-5, atol=1e-5)
    assert pol.assign(tok, off).tolist() == expect


# -- streaming and batch forms agree ----------------------------------------------------------

@pytest.mark.parametrize("name", ["round-robin", "alg2", "balanced"])
@pytest.mark.parametrize("G", [1, 3, 4, 8])
def test_streaming_form_agrees_with_batch_form(name, G):
    rng = np.random.default_rng(100 + G)
    table = random_table(rng, G)
    tok, off = random_requests(rng, 300, hi=200)
    batch = make_policy(name, G, table, window=16).assign(tok, off)
    pol = make_policy(name, G, table, window=16)
    assert stream(pol, tok, off, window=16).tolist() == batch.tolist()
    # assign() is a fresh stream and leaves the streaming state alone
    assert make_policy(name, G, table, window=16).assign(tok, off).tolist() == batch.tolist()
    before = list(pol.queued)
    pol.assign(tok, off)
    assert pol.queued == before


def test_round_robin_is_arrival_order_mod_g():
    tok, off = random_requests(np.random.default_rng(0), 11)
    assert make_policy("round-robin", 4).assign(tok, off).tolist() == [i % 4 for i in range(11)]


# -- balanced -----------------------------------------------------------------------------------

def skewed_stream(rng, G: int, R: int):
    """Requests whose tokens mostly prefer rank 0 (80%), lengths 5..400 tokens."""
    table = random_table(rng, G, U=400, vocab=400)
    S = score_matrix(table, G)[:-1]
    fav = table.token_id[S.argmax(axis=1) == 0]
    lens = rng.integers(5, 400, R)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    tok = np.where(rng.random(off[-1]) < 0.8, rng.choice(fav, off[-1]),
                   rng.choice(table.token_id, off[-1]))
    return table, tok, off


@pytest.mark.parametrize("G", [2, 4, 8])
def test_balanced_keeps_per_rank_tokens_within_five_percent(G):
    rng = np.random.default_rng(G)
    table, tok, off = skewed_stream(rng, G, 4000)
    lens = np.diff(off)
    greedy = make_policy("alg2", G, table).scores(tok, off).argmax(axis=1)
    greedy_load = np.bincount(greedy, weights=lens, minlength=G)
    assert greedy_load.max() / greedy_load.mean() > 1.5          # the stream is skewed
    ranks = make_policy("balanced", G, table).assign(tok, off)
    load = np.bincount(ranks, weights=lens, minlength=G)
    assert load.max() / load.mean() <= 1.05
    # ... and it still follows the table where it can: more requests on rank 0 than round-robin's
    assert (ranks == 0).mean() > 1.0 / G + 0.02


def test_balanced_keeps_a_burst_on_its_preferred_rank_when_room_allows():
    G = 4
    table = two_domain_table(G)
    rng = np.random.default_rng(0)
    a_burst = [rng.integers(0, 100, 10) for _ in range(5)]
    b_burst = [rng.integers(100, 200, 10) for _ in range(5)]
    background = [np.arange(5000, 6000)] * G                       # unknown tokens, 1,000 each
    for name, expect_a, expect_b in (("balanced", {0}, {1}), ("alg2", {0, 1, 2, 3}, None)):
        pol = make_policy(name, G, table)
        assert sorted(pol.submit(t) for t in background) == list(range(G))
        got_a = {pol.submit(t) for t in a_burst}
        got_b = {pol.submit(t) for t in b_burst}
        assert got_a == expect_a, name
        if expect_b is not None:
            assert got_b == expect_b, name
    # a burst larger than the room spills over, and no queue passes the bound when it is taken
    pol = make_policy("balanced", G, table)
    for t in background:
        pol.submit(t)
    got = []
    for _ in range(40):
        got.append(pol.submit(rng.integers(0, 100, 10)))
        q = np.array(pol.queued)
        assert q.max() <= max(1000, 1.05 * q.mean()) + 1e-9
    assert got[:5] == [0] * 5 and len(set(got)) > 1


def test_balanced_one_at_a_time_is_bounded_by_the_stream_totals():
    """Issue 37 kind 1: with nothing in flight the queue bound once admitted no rank and a
    one-domain stream went wholly to its best rank; now the stream's token totals bound it."""
    G = 8
    pol = make_policy("balanced", G, two_domain_table(G))
    rng = np.random.default_rng(1)
    got, lens = [], []
    for _ in range(50 * G):                                        # each finishes before the next
        t = rng.integers(0, 100, int(rng.integers(1, 300)))
        g = pol.submit(t)
        got.append(g)
        lens.append(t.size)
        pol.complete(g, t.size)
    assert got[0] == 0                                             # the affinity still leads
    tok = np.bincount(got, weights=lens, minlength=G)
    assert tok.max() <= 1.05 * tok.mean() + max(lens) and tok.min() > 0


# -- unknown tokens, empty input, validation ------------------------------------------------------

@pytest.mark.parametrize("name", sorted(REQUEST_POLICIES.names()))
def test_unknown_tokens_and_empty_requests_do_not_crash(name):
    G = 4
    table = random_table(np.random.default_rng(3), G)
    tok = np.array([-5, 10**12, 999_999, 2**40, 7], np.int64)
    off = np.array([0, 2, 2, 4, 5, 5])                              # empty requests too
    for t in (table, None, TokenTable(np.zeros(0), np.zeros((2, 0)), np.zeros((2, 0)))):
        ranks = make_policy(name, G, t).assign(tok, off)
        assert ranks.dtype == np.int32 and ranks.shape == (5,) and ((ranks >= 0) & (ranks < G)).all()
        assert make_policy(name, G, t).assign(np.zeros(0, np.int64), np.zeros(1)).shape == (0,)
    pol = make_policy(name, G, table)
    assert 0 <= pol.submit(np.array([10**9])) < G and 0 <= pol.submit(np.zeros(0)) < G


def test_requests_with_no_known_token():
    G = 4
    tok, off = np.arange(10**6, 10**6 + 40), np.arange(0, 41, 4)
    table = random_table(np.random.default_rng(0), G)
    assert make_policy("alg2", G, table).assign(tok, off).tolist() == [i % G for i in range(10)]
    lens = np.diff(off)
    ranks = make_policy("balanced", G, table).assign(tok, off)
    assert np.bincount(ranks, weights=lens, minlength=G).max() <= 12


def test_bad_input_is_rejected():
    pol = make_policy("alg2", 4)
    with pytest.raises(InputError, match="offsets"):
        pol.assign(np.arange(5), np.array([0, 3, 2, 5]))
    with pytest.raises(InputError, match="offsets"):
        pol.assign(np.arange(5), np.array([0, 3]))
    with pytest.raises(InputError, match="unknown request policy"):
        make_policy("nope", 4)
    with pytest.raises(InputError, match="complete"):
        pol.complete(0, 10)
    with pytest.raises(InputError, match="num_ranks"):
        make_policy("balanced", 0)


# -- trace helpers ------------------------------------------------------------------------------

def test_home_from_ranks_and_request_arrays():
    rid = np.array([7, 7, 3, 3, 3, 5, 7])                          # arrival: 7, 3, 5
    tid = np.array([1, 2, 3, 4, 5, 6, 9])
    home = home_from_ranks(rid, np.array([1, 0, 2]), 2)
    assert home.shape == (7, 2) and home.dtype == np.int32
    assert home[:, 0].tolist() == [1, 1, 0, 0, 0, 2, 1] and (home[:, 1] == home[:, 0]).all()
    tok, off, rows = request_arrays(rid, tid)
    assert tok.tolist() == [1, 2, 9, 3, 4, 5, 6] and off.tolist() == [0, 3, 6, 7]
    assert rows.tolist() == [0, 1, 6, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def dev(moe64_split):
    return moe64_split


def test_reorder_requests_keeps_requests_whole(dev):
    _, ev = dev
    for order in ("by-domain", "interleaved"):
        tr = reorder_requests(ev, order, seed=0)
        assert tr.num_tokens == ev.num_tokens
        starts = np.flatnonzero(np.r_[True, tr.request_id[1:] != tr.request_id[:-1]])
        assert starts.size == ev.num_requests                      # each request contiguous
        for r in tr.request_id[starts[:20]]:                      # rows in their original order
            assert (tr.token_id[tr.request_id == r] == ev.token_id[ev.request_id == r]).all()
        if order == "by-domain":
            assert (np.diff(tr.domain[starts]) != 0).sum() == len(ev.domains) - 1


def test_dev_trace_schedulers_beat_round_robin(dev):
    """tiny-moe64, semmoe at EP 4, 20/80 split by request, interleaved arrivals. Measured on
    2026-11-22: alg2 1.23x, balanced 1.14x round-robin's dp LAR; balanced's per-rank tokens
    1.03x the mean, alg2's 2.1x (its mask balances request counts, not tokens)."""
    from sempar.placement import solve
    fit, ev = dev
    placement = solve("semmoe", fit, num_devices=4)
    res = evaluate_policies(placement, ev, orders=("interleaved",))["interleaved"]
    assert res["alg2"]["lar_ratio"] > 1.12
    assert res["balanced"]["lar_ratio"] > 1.08
    assert res["alg2"]["round_count_spread"] == 0
    assert res["balanced"]["tokens_max_mean"] <= 1.05
    assert 0.23 < res["round-robin"]["lar_mean"] < 0.27                # about 1 / G
