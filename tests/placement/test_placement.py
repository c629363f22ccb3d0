"""Placement type, its invariants and JSON I/O; the profile-free solvers."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.errors import InputError
from sempar.placement import SOLVERS, Placement, solve
from sempar.trace.synth import synthesize


@pytest.fixture(scope="module")
def trace():
    return synthesize("olmoe-1b-7b", 3000, seed=2)


def test_registry_lists_the_simple_methods():
    assert {"vanilla", "round-robin"} <= set(SOLVERS.names())


def test_vanilla_is_contiguous(trace):
    p = solve("vanilla", trace, num_devices=4)
    assert p.slots_per_device == 16 and p.num_layers == 16
    assert np.array_equal(p.slots(3)[1], np.arange(16, 32))
    assert p.hosts()[0, 2, 40] and not p.hosts()[0, 1, 40]


def test_round_robin(trace):
    p = solve("round-robin", trace, num_devices=8)
    assert np.array_equal(p.slots(0)[3], np.arange(3, 64, 8))


@pytest.mark.parametrize("method", ["vanilla", "round-robin"])
def test_replicas_and_log2phy_agree(trace, method):
    p = solve(method, trace, num_devices=8, num_nodes=2, redundant=8)
    assert p.num_slots == 72 and p.redundant == 8 and p.num_nodes == 2
    cnt, l2p = p.logcnt(), p.log2phy()
    assert cnt.sum(axis=1).tolist() == [72] * 16 and cnt.min() >= 1
    for e in range(64):
        phys = l2p[0, e][l2p[0, e] >= 0]
        assert phys.size == cnt[0, e] and (p.phy2log[0, phys] == e).all()
    assert np.array_equal(p.node_of, [0, 0, 0, 0, 1, 1, 1, 1])


def test_json_round_trip(trace, tmp_path):
    p = solve("round-robin", trace, num_devices=4, redundant=4)
    p.save(tmp_path / "p.json")
    q = Placement.load(tmp_path / "p.json")
    assert np.array_equal(p.phy2log, q.phy2log) and q.method == "round-robin"


@pytest.mark.parametrize("edit, msg", [
    (lambda a: a.__setitem__((0, 5), 99), "out of range"),
    (lambda a: a.__setitem__((1, 1), 0), "device 0 hosts expert 0 twice"),
    (lambda a: a.__setitem__((2, 3), 4), "hosted nowhere"),
])
def test_invalid_placements(edit, msg):
    phy = np.tile(np.arange(8), (3, 1))
    edit(phy)
    with pytest.raises(InputError, match=msg):
        Placement(phy, 8, 2).validate()


@pytest.mark.parametrize("kwargs, msg", [
    (dict(num_devices=3), "do not split evenly"),
    (dict(num_devices=128), "--ep"),
    (dict(num_devices=4, num_nodes=3), "--nodes"),
])
def test_bad_problem(trace, kwargs, msg):
    with pytest.raises(InputError, match=msg):
        solve("vanilla", trace, **kwargs)


def test_unknown_method(trace):
    with pytest.raises(InputError, match="round-robin"):
        solve("magic", trace, num_devices=4)


def _device_load(p, load):
    """float[L, G]: activations each device computes when replicas share an expert's load."""
    cnt = p.logcnt()
    per = load / cnt
    out = np.zeros((p.num_layers, p.num_devices))
    for l in range(p.num_layers):
        np.add.at(out[l], np.repeat(np.arange(p.num_devices), p.slots_per_device),
                  per[l, p.phy2log[l]])
    return out


def test_eplb_balances_a_skewed_load(trace):
    from sempar.placement.base import PlacementProblem

    load = PlacementProblem(trace, 8).expert_load().astype(float)
    van = _device_load(solve("vanilla", trace, num_devices=8), load)
    ep = _device_load(solve("eplb", trace, num_devices=8, redundant=8), load)
    imb = lambda d: (d.max(axis=1) / d.mean(axis=1)).mean()  # noqa: E731
    assert imb(ep) < imb(van) and imb(ep) < 1.10


def test_rebalance_experts_contract():
    from sempar.placement.eplb import balanced_packing, rebalance_experts, replicate_experts

    w = np.array([[90, 10, 10, 10, 5, 5, 5, 5]], float)
    phy2log, log2phy, logcnt = rebalance_experts(w, 12, num_groups=4, num_nodes=2, num_gpus=4)
    assert phy2log.shape == (1, 12) and logcnt.sum() == 12 and logcnt[0, 0] >= 3
    for e in range(8):
        slots = log2phy[0, e][log2phy[0, e] >= 0]
        assert slots.size == logcnt[0, e] and (phy2log[0, slots] == e).all()
    # hierarchical: each node holds whole expert groups (2 experts per group)
    for node in range(2):
        experts = set(phy2log[0, node * 6:(node + 1) * 6].tolist())
        assert all({2 * g, 2 * g + 1} <= experts or not ({2 * g, 2 * g + 1} & experts)
                   for g in range(4))
    phy, cnt = replicate_experts(np.array([8.0, 2.0, 1.0]), 6)
    assert cnt.tolist() == [4, 1, 1] and sorted(phy.tolist()) == [0, 0, 0, 0, 1, 2]
    packs = balanced_packing(np.array([5.0, 4.0, 3.0, 3.0]), 2)
    assert sorted(np.bincount(packs).tolist()) == [2, 2]
