"""Topology: alpha-beta cost (CAMoE eq. 7 / 9), multi-hop aggregation, presets, JSON I/O."""

import json

import numpy as np
import pytest

from sempar.comm.topology import PHASES, Topology

from sempar.comm.topology_presets import TOPOLOGIES, load_topology, topology_preset
from sempar.errors import InputError


def test_cost_and_eq9_max_over_pairs():
    G = 3
    alpha = np.full((G, G), 1e-6)
    beta = np.array([[0, 1e-9, 2e-9], [1e-9, 0, 1e-9], [4e-9, 1e-9, 0]])
    t = Topology("t", [0, 0, 1], alpha, beta)
    assert t.alpha.shape == (3, G, G) and t.alpha[0, 1, 1] == 0
    b = np.array([[5, 1000, 0], [0, 0, 10], [100, 0, 0]], float)
    c = t.cost("dispatch", b)
    assert c[0, 0] == 0                              # diagonal: alpha 0, beta 0
    assert c[0, 2] == 0                              # nothing sent, nothing paid
    assert c[0, 1] == pytest.approx(1e-6 + 1e-6)
    assert c[2, 0] == pytest.approx(1e-6 + 4e-7)
    assert t.a2a_seconds("dispatch", b) == pytest.approx(max(c.ravel()))
    stack = np.stack([b, 2 * b])
    assert t.a2a_seconds("combine", stack).shape == (2,)
    assert t.a2a_seconds("combine", stack)[1] == pytest.approx(1e-6 + 2000 * 1e-9)


def test_multi_hop_store_and_forward_and_cut_through():
    links = [(0, "sw", 1e-6, 1e-9), ("sw", 1, 2e-6, 3e-9), (1, 0, 5e-6, 1e-9)]
    sf = Topology.from_links("sf", [0, 0], links, aggregation="store-and-forward")
    ct = Topology.from_links("ct", [0, 0], links, aggregation="cut-through")
    for p in range(len(PHASES)):
        assert sf.alpha[p, 0, 1] == pytest.approx(3e-6) and ct.alpha[p, 0, 1] == pytest.approx(3e-6)
        assert sf.beta[p, 0, 1] == pytest.approx(4e-9)      # sum of betas
        assert ct.beta[p, 0, 1] == pytest.approx(3e-9)      # max of betas
        assert sf.alpha[p, 1, 0] == pytest.approx(5e-6)     # direct link
    # per-phase parameters and an explicit path through a device
    links = [(0, 1, [1e-6, 2e-6, 3e-6], 1e-9), (1, 2, 1e-6, [1e-9, 2e-9, 3e-9]),
             (0, 2, 1.0, 1.0)]
    t = Topology.from_links("p", [0, 0, 0], links, paths={(0, 2): [0, 1, 2]}, symmetric=True)
    assert t.alpha[:, 0, 2] == pytest.approx([2e-6, 3e-6, 4e-6])
    assert t.beta[:, 0, 2] == pytest.approx([2e-9, 3e-9, 4e-9])
    assert t.alpha[1, 2, 0] == pytest.approx(3e-6)       # reverse: cheapest path 2 -> 1 -> 0


def test_presets_figures():
    assert set(TOPOLOGIES.names()) >= {"nvlink8", "pcie-upi8", "a100x4-ib", "hetero-cloud"}
    bw = lambda t, u, v: 1 / t.beta[1, u, v] / 1e9               # GB/s
    t = topology_preset("nvlink8")
    assert t.num_devices == 8 and bw(t, 0, 7) == pytest.approx(900)
    t = topology_preset("pcie-upi8")
    assert bw(t, 0, 3) == pytest.approx(64) and bw(t, 0, 4) == pytest.approx(20)
    assert t.node_of.tolist() == [0] * 4 + [1] * 4
    t = topology_preset("a100x4-ib", nodes=3)
    assert t.num_devices == 12 and t.num_nodes == 3
    assert bw(t, 0, 1) == pytest.approx(600) and bw(t, 0, 4) == pytest.approx(25)
    assert topology_preset("a100x4-ib").num_devices == 8
    t = topology_preset("hetero-cloud")
    assert t.num_devices == 8
    assert t.alpha[1, 0, 1] == pytest.approx(429e-9) and t.alpha[1, 6, 7] == pytest.approx(8325e-9)
    assert 8 / t.beta[1, 0, 2] / 1e6 == pytest.approx(1500)      # 1500 Mbit between nodes 1, 2
    assert 8 / t.beta[1, 2, 4] / 1e6 == pytest.approx(10000)
    assert t.alpha[1, 0, 2] > t.alpha[2, 0, 2] > t.alpha[0, 0, 2]  # dispatch > combine > metadata


def test_json_round_trip_and_load(tmp_path):
    t = topology_preset("pcie-upi8")
    p = tmp_path / "t.json"
    t.save(p)
    u = load_topology(p)
    assert np.array_equal(u.alpha, t.alpha) and np.array_equal(u.beta, t.beta)
    assert u.node_of.tolist() == t.node_of.tolist()
    assert load_topology("a100x4-ib:4").num_devices == 16
    assert load_topology("a100x4-ib", nodes=3).num_devices == 12
    # the link-list form
    d = {"name": "two", "node_of": [0, 1],
         "links": [{"src": 0, "dst": 1, "alpha": 1e-6, "beta": {"metadata": 1e-9, "dispatch": 2e-9,
                                                               "combine": 3e-9}}],
         "symmetric": True}
    p.write_text(json.dumps(d))
    t = load_topology(p)
    assert t.beta[:, 1, 0] == pytest.approx([1e-9, 2e-9, 3e-9])


@pytest.mark.parametrize("bad, msg", [
    ({"name": "x", "node_of": [0, 0], "alpha": [[0, -1], [1, 0]], "beta": [[0, 1], [1, 0]]},
     "negative"),
    ({"name": "x", "node_of": [0, 0], "alpha": [[0, 1, 1], [1, 0, 1]], "beta": [[0, 1], [1, 0]]},
     "shape"),
    ({"name": "x", "node_of": [0, 2], "alpha": [[0, 1], [1, 0]], "beta": [[0, 1], [1, 0]]},
     "node ids"),
    ({"name": "x", "node_of": [0, 0]}, "missing field"),
    ({"name": "x", "node_of": [0, 0], "links": [{"src": 0, "dst": 1, "alpha": 1, "beta": 1}]},
     "no route"),
])
def test_validation(bad, msg):
    with pytest.raises(InputError, match=msg):
        Topology.from_json(bad)


def test_unknown_names():
    with pytest.raises(InputError, match="unknown topology"):
        load_topology("no-such")
    with pytest.raises(InputError, match="one server"):
        topology_preset("nvlink8", nodes=2)
