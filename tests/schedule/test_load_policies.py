"""The router's request policies (schedule/load_policies.py) and their registry entries: the
streaming form (what `sempar router` runs) agrees with the batch form (what `evaluate --online`
and `serve-sim` run), load bounds hold, the in-flight mask is obeyed, prefix affinity works."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.router.policies import make_router_policy, reads_table, router_command
from sempar.schedule.load_policies import PrefixCache
from sempar.schedule.requests import REQUEST_POLICIES, make_policy
from test_request_policies import random_requests, random_table, stream, two_domain_table

NEW = ("least-inflight", "expert", "expert+prefix", "expert-idf")


def test_router_policies_are_request_policies():
    assert set(NEW) <= set(REQUEST_POLICIES)
    for name in REQUEST_POLICIES:          # one registry: the router reads the capability
        assert reads_table(name) == REQUEST_POLICIES.get(name).needs_scores
        assert REQUEST_POLICIES.get(name).summary


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("G", [1, 3, 4])
def test_streaming_reproduces_the_batch_form(name, G):
    rng = np.random.default_rng(G)
    tok, off = random_requests(rng, 150)
    pol = make_policy(name, G, random_table(rng, G), window=7)
    batch = pol.assign(tok, off)
    assert np.array_equal(pol.assign(tok, off), batch)        # batch form leaves no state
    assert np.array_equal(stream(pol, tok, off, window=7), batch)
    assert batch.min() >= 0 and batch.max() < G


def test_expert_keeps_stream_totals_within_slack_and_follows_affinity():
    G = 2
    rng = np.random.default_rng(0)
    R = 400
    lens = rng.integers(5, 40, R)
    dom = rng.integers(0, 2, R)
    off = np.concatenate([[0], np.cumsum(lens)])
    tok = np.concatenate([rng.integers(0, 100, n) + 100 * d for n, d in zip(lens, dom)])
    pol = make_policy("expert", G, two_domain_table(G), slack=0.05)
    r = pol.assign(tok, off)
    toks = np.bincount(r, weights=lens, minlength=G)
    cnt = np.bincount(r, minlength=G)
    assert toks.max() / toks.mean() <= 1.05 + lens.max() / toks.mean()
    assert cnt.max() / cnt.mean() <= 1.05 + 1 / cnt.mean()
    assert (r == dom).mean() > 0.8                       # random domains: affinity mostly wins


@pytest.mark.parametrize("name", ("round-robin", "alg2", "balanced") + NEW)
def test_the_in_flight_mask_is_obeyed(name):
    G = 4
    pol = make_router_policy(name, G, random_table(np.random.default_rng(1), G))
    rng = np.random.default_rng(2)
    for i in range(50):
        allowed = [bool(x) for x in rng.integers(0, 2, G)]
        if not any(allowed):
            allowed[i % G] = True
        g = pol.submit(rng.integers(0, 1000, 20), allowed)
        assert allowed[g]


def test_least_inflight_takes_the_emptiest_rank():
    """Among the ranks the balance contract admits (equal tokens and requests so far: all of
    them) the one with the fewest tokens in flight; lengths alone no longer decide early in a
    stream (issue 45: the contract's token projection may overrule them)."""
    pol = make_policy("least-inflight", 3)
    assert [pol.submit(np.arange(10)) for _ in range(3)] == [0, 1, 2]
    pol.complete(1, 10)
    assert pol.submit(np.arange(10)) == 1
    pol.complete(0, 10)
    pol.complete(2, 10)
    assert pol.submit(np.arange(10)) in (0, 2)           # in flight: 0, 10, 0


def test_expert_prefix_sends_a_shared_prefix_back_to_its_rank():
    G = 4
    pol = make_policy("expert+prefix", G, two_domain_table(G), inflight_slack=10.0, slack=10.0,
                      prefix_weight=2.0)
    shared = np.arange(300, 364)                          # 64 unknown tokens: two blocks
    first = pol.submit(np.concatenate([shared, [5]]))
    again = pol.submit(np.concatenate([shared, [150, 151]]))   # its tokens vote rank 1
    assert again == first == 0
    plain = make_policy("expert", G, two_domain_table(G), inflight_slack=10.0, slack=10.0)
    plain.submit(np.concatenate([shared, [5]]))
    assert plain.submit(np.concatenate([shared, [150, 151]])) == 1


def test_prefix_cache_is_bounded_lru():
    c = PrefixCache(1, block=2, capacity=3)
    h = c.hashes(np.arange(8))
    assert len(h) == 4 and c.match(0, h) == 0
    c.insert(0, h)
    assert c.match(0, h) == 0 and c.match(0, h[:1]) == 0 and len(c.ranks[0]) == 3
    c.insert(0, h[:2])
    assert c.match(0, h) == 2


def test_router_command_only_when_the_policy_is_not_the_engines():
    assert router_command("p.json", "http://127.0.0.1:30000", "sglang", 4, "m") == (
        "sempar router --placement p.json --upstream http://127.0.0.1:30000 --engine sglang "
        "--dp-size 4 --model-dir m --policy expert-idf --port 30080")
    assert router_command("p.json", "http://h:1", "sglang", 4, "m", policy="round-robin") is None
    assert router_command("p.json", "http://h:1", "vllm", 4, "m", policy="least-inflight") is None


def test_plan_prints_the_router_command_unless_the_policy_is_sglangs():
    import numpy as np

    from sempar.placement.placement import Placement
    from sempar.serving.deploy import commands
    from sempar.serving.systems import Variant

    p = Placement(phy2log=np.arange(16, dtype=np.int32).reshape(1, 16), num_experts=16, num_devices=4,
                  method="sempar")
    for policy, want in (("alg2", True), ("expert", True), ("round-robin", False)):
        lines = commands(Variant("sempar", "sglang-ep", policy, "online"), 4, 1, "t.parquet",
                         "tiny-moe64", p)
        routers = [x for x in lines if x.startswith("sempar router ")]
        assert bool(routers) == want
        if want:
            assert f"--policy {policy}" in routers[0] and "--dp-size 4" in routers[0]


def test_expert_idf_stops_a_shared_frame_from_voting():
    """Every request carries the same 40-token frame (ids the table sends to rank 0) and 10
    tokens of its own domain: `expert` follows the frame, `expert-idf` the domain."""
    G, R = 2, 200
    rng = np.random.default_rng(3)
    dom = rng.integers(0, 2, R)
    frame = np.tile(np.arange(10), 4)
    reqs = [np.concatenate([frame, rng.integers(10, 100, 10) + 90 * d]) for d in dom]
    off = np.concatenate([[0], np.cumsum([r.size for r in reqs])])
    tok = np.concatenate(reqs)
    loose = dict(slack=10.0, inflight_slack=10.0)
    plain = make_policy("expert", G, two_domain_table(G), **loose).assign(tok, off)
    idf = make_policy("expert-idf", G, two_domain_table(G), **loose).assign(tok, off)
    assert (plain == 0).all()
    assert (idf[20:] == dom[20:]).mean() > 0.9


@pytest.mark.parametrize("name", sorted(REQUEST_POLICIES.names()))
def test_prepared_submit_routes_as_the_plain_one(name):
    """The router prepares a big prompt's rows off its event loop; the ranks are the same."""
    G = 4
    rng = np.random.default_rng(5)
    tok, off = random_requests(rng, 120)
    table = random_table(rng, G)
    a, b = make_policy(name, G, table), make_policy(name, G, table)
    for i in range(off.size - 1):
        t = tok[off[i]:off[i + 1]]
        assert a.submit(t) == b.submit(b.prepare(t)), i
        assert a.queued == b.queued
