"""The balance contract of the request policies (issue 37, "Balance is part of the policy's
contract"): for sequential, bursty and concurrent arrivals, with requests of tokens the table
does not know mixed in, every policy that declares `balances` keeps each declared per-rank count
within BALANCE_SLACK of the mean once the stream holds BALANCE_FROM x G requests, up to the
granularity of requests (two requests; the tokens of two of the longest), and the policies that
balance requests skip a rank that is behind while another is above the mean in at most 2 % of
their choices (the contract asks for none; `expert` misses it in rare cases where the rank
that is behind in requests is ahead in tokens: see docs/router.md).

Kind 1 of the audit (ranks starving under one-at-a-time traffic: [137, 0, 263, 0]) fails this at
once: with nothing in flight no rank was admissible and the fallback took the best score."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sempar.schedule.requests import BALANCE_FROM, BALANCE_SLACK, REQUEST_POLICIES, make_policy
from test_request_policies import random_table

CLAIMING = [n for n in REQUEST_POLICIES.names() if REQUEST_POLICIES.get(n).balances]


def replay(name: str, G: int, pattern: str, seed: int, unknown: float, lo: int, hi: int,
           R: int):
    """(ranks int[R], lens int[R], skips): `R` requests under `pattern`, completions as it says."""
    rng = np.random.default_rng(seed)
    pol = make_policy(name, G, random_table(rng, G, U=300, vocab=1000))
    inflight: list[tuple[int, int]] = []
    ranks, lens, k, skips = [], [], np.zeros(G), 0
    for _ in range(R):
        n = int(rng.integers(lo, hi + 1))
        tok = rng.integers(5000, 6000, n) if rng.random() < unknown else rng.integers(0, 1000, n)
        if pattern == "sequential" or (pattern == "bursty" and rng.random() < 0.2):
            done, inflight = inflight, []
        else:                                   # concurrent: up to 32 in flight, random ends
            done = []
            while len(inflight) >= 32 or (inflight and pattern == "concurrent"
                                          and rng.random() < 0.5):
                done.append(inflight.pop(int(rng.integers(len(inflight)))))
        for g, m in done:
            pol.complete(g, m)
        before = k.copy()
        g = pol.submit(tok)
        if before[g] > before.mean() and (before < (1 - BALANCE_SLACK) * before.mean() - 1).any():
            skips += 1
        inflight.append((g, n))
        k[g] += 1
        ranks.append(g)
        lens.append(n)
    return np.array(ranks), np.array(lens), skips


@settings(max_examples=60, deadline=None, derandomize=True)
@given(name=st.sampled_from(CLAIMING), G=st.integers(2, 8),
       pattern=st.sampled_from(["sequential", "bursty", "concurrent"]),
       seed=st.integers(0, 2**31), unknown=st.sampled_from([0.0, 0.3, 1.0]),
       lens=st.sampled_from([(16, 512), (1, 60), (200, 400)]))
def test_declared_balance_holds_for_any_arrival_pattern(name, G, pattern, seed, unknown, lens):
    R = 2 * BALANCE_FROM * G
    ranks, L, skips = replay(name, G, pattern, seed, unknown, *lens, R)
    claims = REQUEST_POLICIES.get(name).balances
    s = BALANCE_SLACK
    for i in range(BALANCE_FROM * G, R + 1, G):
        k = np.bincount(ranks[:i], minlength=G)
        c = np.bincount(ranks[:i], weights=L[:i], minlength=G)
        if "requests" in claims:
            assert np.abs(k - k.mean()).max() <= s * k.mean() + 2, (i, k)
        if "tokens" in claims:
            assert np.abs(c - c.mean()).max() <= s * c.mean() + 2 * L.max(), (i, c)
    if "requests" in claims:
        assert skips <= 0.02 * R


def test_one_at_a_time_traffic_reaches_every_rank():
    """The audit's case: 400 sequential requests, one domain dominating the table's votes."""
    for name in CLAIMING + ["least-inflight"]:
        ranks, _, _ = replay(name, 4, "sequential", 0, 0.0, 16, 512, 400)
        cnt = np.bincount(ranks, minlength=4)
        assert cnt.min() >= 0.9 * cnt.mean(), (name, cnt)
        ranks, _, _ = replay(name, 4, "sequential", 1, 1.0, 16, 512, 400)   # unknown tokens only
        assert np.bincount(ranks, minlength=4).min() >= 0.9 * 100, name

