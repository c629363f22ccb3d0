"""The comm simulator against the runtime's counted bytes, every runtime mode including exflow
(issue 19 item 2): the same small workload (tiny-moe64, G = 2, vanilla and permuted + replicated
placements) run by `sempar.runtime` and simulated under `runtime_options`.

Per MoE layer: dispatch and combine equal per directed pair; everything the layer sends
(size exchanges, exflow's context all-gather, attention collectives, dispatch, combine) equal
per pair for the DP modes and in total for the TP ones (their direct RS / AG spread a ring's
bytes over all peers). The only bytes left out: the final hidden states gathered on rank 0
after the last layer (`output` and its size exchange, counted as layer -1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sempar.comm.pipelines import PIPELINES
from sempar.comm.simulate import runtime_options, simulate
from sempar.runtime import DISPATCHERS, MODES, RunSpec, run_many
from test_runtime import homes, permuted_replicated, routing, shape, uniform_topology, vanilla

MODEL, G = "tiny-moe64", 2


@pytest.fixture(scope="module")
def runs():
    L, N, _, _ = shape(MODEL)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(2, 8192, (3 * G, 10), generator=g)       # 3 requests per rank
    targets = torch.randint(-1, G, (L, ids.numel()), generator=g)
    specs = [RunSpec(MODEL, ids, p, mode, targets=targets if mode == "tp-rebatch" else None)
             for p in (vanilla(MODEL, G), permuted_replicated(MODEL, G, extra=4))
             for mode in MODES]
    return ids, specs, run_many(specs, G, deadline=600)


def test_every_mode_counted_as_simulated(runs):
    ids, specs, results = runs
    experts = routing(MODEL, ids)
    L, _, _, H = shape(MODEL)
    seen = set()
    for spec, r in zip(specs, results):
        what = f"{spec.mode} {spec.placement.method}"
        sim = simulate(experts, homes(spec.mode, spec, G, L, experts), spec.placement,
                       uniform_topology(G), PIPELINES.get(DISPATCHERS.get(spec.mode).pipeline),
                       runtime_options(H, ids.numel()))["bytes_per_pair"]     # [L, 4, G, G]
        got = r.dispatch_combine(L)
        np.testing.assert_array_equal(got[:, 0], sim[:, 1], err_msg=what + " dispatch")
        np.testing.assert_array_equal(got[:, 1], sim[:, 2], err_msg=what + " combine")
        layer = np.zeros((L, G, G), np.int64)
        for (l, _name), v in r.bytes.items():
            if l >= 0:
                layer[l] += v
        if spec.mode in ("attn-dp", "exflow"):
            np.testing.assert_array_equal(layer, sim.sum(axis=1), err_msg=what + " all")
        else:
            np.testing.assert_array_equal(layer.sum(axis=(1, 2)), sim.sum(axis=(1, 2, 3)),
                                          err_msg=what + " all")
        # what is left: the final hidden states to rank 0 and their size exchange (layer -1)
        assert {n for (l, n) in r.bytes if l < 0} <= {"output", "sizes"}, what
        assert layer.sum() == sim.sum(), what
        seen.add(spec.mode)
    assert seen == set(MODES)


def test_exflow_context_by_hand(runs):
    """exflow's prefill context all-gather, by hand: every token's row (4 H + 4 bytes: fp32
    hidden state and int32 index) goes from the rank holding it to the G - 1 others, every layer;
    it is the bytes the per-iteration all-gather of ExFlow's `exflow` pipeline charges once."""
    ids, specs, results = runs
    L, _, _, H = shape(MODEL)
    for spec, r in zip(specs, results):
        if spec.mode == "exflow":
            ctx = r.total("context-ag")
            assert ctx == L * ids.numel() * (G - 1) * (4 * H + 4)
