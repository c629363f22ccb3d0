"""One serving rule (placement/serving.py) for the evaluator, the runtime and the simulator: on a
replicated two-node placement (G = 8, R = G), every activation of every (token, layer) is served
by the same device in `metrics.serving_device`, in `runtime.dispatch.ep_moe` (run rank by rank
over a recording stand-in for the process group) and in the comm simulator's replica table on a
topology whose links follow the nodes (`a100x4-ib`), and that device is the one the rule names,
computed here by hand: home, else the lowest id on home's node, else the lowest id."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sempar.comm.pipelines import PIPELINES
from sempar.comm.simulate import SimOptions, replica_table, simulate
from sempar.comm.topology_presets import topology_preset
from sempar.placement.metrics import placement_figures, serving_device
from sempar.placement.placement import Placement
from sempar.runtime.dispatch import ep_moe, serving_table

G, N, L, K, T = 8, 16, 3, 2, 400
NODE_OF = np.repeat([0, 1], 4).astype(np.int32)


def replicated(seed: int = 0) -> Placement:
    """Per layer a random permutation (2 experts per device) and one replica per device (R = G):
    layer 0 of the next device's first expert (mostly on the same node), layer 1 of the first
    expert of the device 4 ids on (the other node), layer 2 of one of 3 hot experts."""
    rng = np.random.default_rng(seed)
    rows = []
    for l in range(L):
        prim = rng.permutation(N).reshape(G, N // G)
        hot = rng.choice(N, 3, replace=False)
        extra = [prim[(d + 1) % G, 0] if l == 0 else prim[(d + 4) % G, 0] if l == 1
                 else rng.choice(np.setdiff1d(hot, prim[d])) for d in range(G)]
        rows.append(np.concatenate([np.append(prim[d], extra[d]) for d in range(G)]))
    return Placement(np.stack(rows), N, G, node_of=NODE_OF, method="test").validate()


def routing(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(experts int64[T, L, K] distinct per token, home int32[T, L])."""
    rng = np.random.default_rng(seed)
    experts = np.argsort(rng.random((T, L, N)), axis=2)[:, :, :K]
    return experts, rng.integers(0, G, (T, L)).astype(np.int32)


def by_hand(p: Placement, experts: np.ndarray, home: np.ndarray) -> np.ndarray:
    """int64[T, L, K]: the rule, one activation at a time."""
    out = np.empty(experts.shape, np.int64)
    for l in range(L):
        slots = p.slots(l)
        for t in range(T):
            h = int(home[t, l])
            for j, e in enumerate(experts[t, l]):
                hosts = [d for d in range(G) if e in slots[d]]
                near = [d for d in hosts if NODE_OF[d] == NODE_OF[h]]
                out[t, l, j] = h if h in hosts else min(near) if near else min(hosts)
    return out


class _Comm:
    """The process group as `ep_moe` sees it: records this rank's dispatch packets and hands it
    `inbox` (the packets the others sent it; None: nothing)."""

    def __init__(self, rank: int, inbox: list[torch.Tensor] | None):
        self.rank, self.world, self.inbox, self.sent = rank, G, inbox, None

    def all_to_all_v(self, send, send_rows, layer, name, recv_rows=None):
        if name == "combine":
            return torch.zeros((sum(recv_rows),) + tuple(send.shape[1:])), recv_rows
        self.sent = list(torch.split(send, send_rows))
        got = self.inbox or [send[:0]] * G
        return torch.cat(got), [int(b.shape[0]) for b in got]


class _Experts:
    """Records which activations `ep_moe` computes on this rank (x[:, 0]: the token index)."""

    def __init__(self):
        self.calls = []

    def apply(self, x, ids, w, mask):
        self.calls.append((x[:, 0].long(), mask))
        return torch.zeros_like(x)


def runtime_devices(p: Placement, experts: np.ndarray, home: np.ndarray) -> np.ndarray:
    """int64[T, L, K]: the rank on which `ep_moe` computes each activation (-1: none; a second
    computation fails the test), every rank run twice: once to collect the packets, once to
    receive them."""
    out = np.full(experts.shape, -1, np.int64)
    for l in range(L):
        serve = serving_table(p, l, torch.device("cpu"))
        toks = [np.flatnonzero(home[:, l] == g) for g in range(G)]

        def run(g: int, inbox) -> tuple[_Comm, _Experts]:
            comm, ex = _Comm(g, inbox), _Experts()
            x = torch.as_tensor(toks[g], dtype=torch.float32)[:, None]
            ids = torch.as_tensor(experts[toks[g], l])
            ep_moe(x, ids, torch.ones(ids.shape), serve, ex, comm, l)
            return comm, ex
        sent = [run(g, None)[0].sent for g in range(G)]
        for g in range(G):
            _, ex = run(g, [sent[s][g] for s in range(G)])
            for tok, mask in ex.calls:
                t, j = (a.numpy() for a in torch.nonzero(mask, as_tuple=True))
                assert (out[tok.numpy()[t], l, j] == -1).all(), "an activation computed twice"
                out[tok.numpy()[t], l, j] = g
    return out


@pytest.fixture(scope="module")
def case():
    p = replicated()
    experts, home = routing()
    return p, experts, home, by_hand(p, experts, home)


def test_the_case_needs_every_tier(case):
    # the placement and routing reach every branch of the rule, so a rule that drops one of them
    # (home first, node next, lowest id last) serves some activation elsewhere
    p, experts, home, want = case
    hosts = p.hosts()
    at_home = want == home[:, :, None]
    node = NODE_OF[want] == NODE_OF[home][:, :, None]
    idx = np.arange(G)[None, None, None, :]
    hosted = hosts[np.arange(L)[None, :, None], :, experts]             # [T, L, K, G]
    lower = (hosted & (idx < want[..., None])).any(axis=3)
    higher = (hosted & (idx > want[..., None])).any(axis=3)
    assert (at_home & lower).any()                  # home beats a lower id
    assert (~at_home & node & lower).any()          # home's node beats a lower id
    assert (~node & higher).any()                   # off the node, the lowest of several hosts


def test_metrics_runtime_and_simulator_serve_alike(case):
    p, experts, home, want = case
    np.testing.assert_array_equal(serving_device(p, experts, home), want, err_msg="metrics")
    np.testing.assert_array_equal(runtime_devices(p, experts, home), want, err_msg="runtime")
    topo = topology_preset("a100x4-ib")
    assert (topo.node_of == p.node_of).all()
    table, by_home = replica_table(p, topo, 256)
    assert by_home
    sim = np.stack([table[l][home[:, l][:, None], experts[:, l]] for l in range(L)], axis=1)
    np.testing.assert_array_equal(sim, want, err_msg="simulator")
    # and the simulator's own figures: LAR per layer, remote copies per token
    f = placement_figures(p, experts, home)
    r = simulate(experts, home, p, topo, PIPELINES.get("attn-dp"), SimOptions(hidden=128))
    assert [x["lar"] for x in r["layers"]] == f["lar"].tolist()
    assert np.mean([x["remote_copies_per_token"] for x in r["layers"]]) == \
        pytest.approx(f["remote_copies_per_token"], rel=1e-12)


def test_a_single_node_topology_ignores_the_placements_nodes(case):
    # the simulator's cost order on uniform links is home, then the lowest id: it differs from
    # the node order wherever a lower id off home's node hosts the expert
    p, experts, home, want = case
    table, _ = replica_table(p, topology_preset("nvlink8"), 256)
    sim = np.stack([table[l][home[:, l][:, None], experts[:, l]] for l in range(L)], axis=1)
    p1 = Placement(p.phy2log, N, G, method="test").validate()        # one node
    assert (sim == serving_device(p1, experts, home)).all()
    assert (sim != want).any()
