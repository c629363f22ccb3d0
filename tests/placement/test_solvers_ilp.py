"""ILP placements `exflow` and `moetuner` (sempar.placement.ilp)."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.errors import InputError
from sempar.placement import SOLVERS, PlacementProblem, ilp, moetuner, solve
from sempar.trace.schema import RoutingTrace, TraceMeta
from sempar.trace.synth import synthesize


def shifted_trace(n_tokens: int = 400, N: int = 8, shift: int = 3, seed: int = 0) -> RoutingTrace:
    """2 layers, top-1: expert i at layer 0 is always followed by (i + shift) % N at layer 1."""
    rng = np.random.default_rng(seed)
    e0 = rng.integers(0, N, n_tokens)
    experts = np.stack([e0, (e0 + shift) % N], axis=1)[:, :, None].astype(np.int32)
    meta = TraceMeta(model="shifted", num_layers=2, num_experts=N, top_k=1, vocab_size=16)
    return RoutingTrace(meta, token_id=rng.integers(0, 16, n_tokens).astype(np.int64),
                        request_id=(np.arange(n_tokens) // 20).astype(np.int64),
                        position=(np.arange(n_tokens) % 20).astype(np.int64), experts=experts)


def gpu_of(p) -> np.ndarray:
    """int[L, N]: device of each expert (no replicas)."""
    out = np.zeros((p.num_layers, p.num_experts), int)
    dev = np.repeat(np.arange(p.num_devices), p.slots_per_device)
    for l in range(p.num_layers):
        out[l, p.phy2log[l]] = dev
    return out


def locality(p, trace) -> float:
    C = ilp.affinity_counts(trace.experts, trace.meta.num_experts)
    return ilp.kept_affinity(gpu_of(p), C) / C.sum()


def max_gpu_load(p, trace) -> np.ndarray:
    load = PlacementProblem(trace, p.num_devices).expert_load()
    g = gpu_of(p)
    return np.array([np.bincount(g[l], weights=load[l], minlength=p.num_devices).max()
                     for l in range(p.num_layers)])


def test_registered():
    assert {"exflow", "moetuner"} <= set(SOLVERS.names())


@pytest.mark.parametrize("window", [1, None])          # chain of exact ILPs, or one joint ILP
def test_exflow_follows_the_shift(window):
    t = shifted_trace()
    p = ilp.exflow(PlacementProblem(t, 2), time_limit=5.0, window=window)
    p.validate()
    g = gpu_of(p)
    assert all(g[0, i] == g[1, (i + 3) % 8] for i in range(8))
    assert locality(p, t) == 1.0 and p.info["inter_layer_locality"] == 1.0
    assert [np.bincount(g[l], minlength=2).tolist() for l in range(2)] == [[4, 4], [4, 4]]
    assert p.info["status"] == "optimal" and p.info["mip_gap_max"] == pytest.approx(0.0, abs=1e-6)
    assert solve("vanilla", t, num_devices=2).phy2log.shape == p.phy2log.shape
    assert locality(solve("vanilla", t, num_devices=2), t) < 1.0      # the vanilla split does not


def test_exflow_staged_nodes_and_batches():
    t = shifted_trace()
    p = ilp.exflow(PlacementProblem(t, 4, num_nodes=2), time_limit=5.0, window=None, batches=2)
    g = gpu_of(p)
    assert all(g[0, i] == g[1, (i + 3) % 8] for i in range(8))
    assert {i["stage"].split(": ")[1] for i in p.info["ilps"]} == {"nodes", "node 0 gpus",
                                                                     "node 1 gpus"}
    assert [b["tokens"] for b in p.info["batches"]] == [200, 400]
    assert (np.bincount(g.ravel(), minlength=4) == 4).all()


def test_time_limit_path_returns_a_valid_placement():
    t = synthesize("olmoe-1b-7b", 3000, seed=3)
    p = ilp.exflow(PlacementProblem(t, 4), time_limit=0.05, window=None)
    p.validate()
    assert p.info["status"] in ("time_limit", "fallback")
    for i in p.info["ilps"]:
        assert i["status"] != 0 and {"mip_gap", "dual_bound", "objective"} <= set(i)
    g = gpu_of(p)
    assert all((np.bincount(g[l], minlength=4) == 16).all() for l in range(g.shape[0]))


def test_moetuner_balances_and_keeps_affinity():
    t = synthesize("olmoe-1b-7b", 20000, seed=1)
    van = solve("vanilla", t, num_devices=4)
    mt = moetuner.moetuner(PlacementProblem(t, 4), time_limit=6.0)
    mt.validate()
    assert max_gpu_load(mt, t).mean() <= max_gpu_load(van, t).mean()
    assert (max_gpu_load(mt, t) <= max_gpu_load(van, t) * 1.001).all()
    assert locality(mt, t) > locality(van, t)
    assert mt.info["status"] in ("optimal", "time_limit")


@pytest.mark.parametrize("method", ["exflow", "moetuner"])
def test_refuses_replicas(method):
    with pytest.raises(InputError, match="replicas"):
        solve(method, shifted_trace(), num_devices=2, redundant=2)
