"""`sempar`'s replica step (placement/sempar/replicas.py): its served-load model is the
evaluator's serving rule, it spends replicas on the peak first, and tp mode's balancing pass
lowers the peak while every device keeps its slots."""

from __future__ import annotations

import numpy as np

from sempar.placement import solve
from sempar.placement.base import PlacementProblem
from sempar.placement.metrics import placement_figures
from sempar.placement.sempar import SemparConfig, sempar_solve
from sempar.placement.sempar.replicas import _serve_rank, _served_one, add_replicas
from sempar.schedule.homes import home_tp_contiguous
from sempar.trace import split_by_request
from test_sempar_solver import G, L, N, planted


def _served(hosts: np.ndarray, Wt: np.ndarray, node_of: np.ndarray) -> np.ndarray:
    rank = _serve_rank(node_of)
    return sum(_served_one(hosts[:, e], Wt[:, e], rank) for e in range(hosts.shape[1]))


def test_served_loads_are_the_evaluators():
    trace, _, _ = planted(T=20_000)
    fit, _ = split_by_request(trace, seed=0)
    for nodes in (1, 2):
        p = solve("sempar", fit, num_devices=G, num_nodes=nodes, redundant=G)
        home = home_tp_contiguous(fit.num_tokens, G, L)
        want = placement_figures(p, fit.experts, home)["load"]
        hosts = p.hosts()
        for l in range(L):
            e = fit.experts[:, l].astype(np.int64)
            Wt = np.zeros((G, N))
            np.add.at(Wt, (np.repeat(home[:, l], e.shape[1]), e.ravel()), 1.0)
            assert np.allclose(_served(hosts[l], Wt, p.node_of), want[l])


def test_replicas_cut_the_peak_first(cfg: SemparConfig = SemparConfig()):
    # expert 0 (on device 0) is hot, used by the tokens of every device; a decoy, expert 1's
    # tokens homed on device 3, would draw device 3's replica if locality came first
    Wt = np.ones((G, N))
    Wt[:, 0] = [100.0, 60.0, 60.0, 60.0]
    Wt[3, 1] = 90.0
    hosts = (np.arange(N) % G)[None, :] == np.arange(G)[:, None]
    node_of = np.zeros(G, np.int64)
    before = _served(hosts, Wt, node_of)
    out = add_replicas(hosts, Wt, 1, before.mean(), node_of, cfg)
    assert (out.sum(axis=1) == hosts.sum(axis=1) + 1).all() and (out >= hosts).all()
    after = _served(out, Wt, node_of)
    assert out[1:, 0].all()                         # every other device took a replica of 0
    # 292 -> 162 (device 1: its decoy traffic and its own tokens of expert 0); locality first
    # (device 3 takes expert 1) would leave device 0 at 172
    assert after.max() < 170.0 and np.isclose(after.sum(), before.sum())


def test_large_shapes_score_the_peak_devices_replicas():
    # above full_scan open pairs only the top pairs by locality and the peak device's experts
    # are scored: the hot expert's replicas are still among them
    test_replicas_cut_the_peak_first(SemparConfig(full_scan=0, top_pairs=1))


def test_balance_pass_lowers_the_robust_peak_and_keeps_the_slots():
    from sempar.placement.sempar.load import LoadModel
    from sempar.placement.sempar.replicas import balance_pass

    rng = np.random.default_rng(3)
    Wt = rng.gamma(0.6, 10.0, (G, N))
    Wt[0, : N // G] *= 4.0                          # device 0's own tokens favour its experts
    hosts = (np.arange(N) // (N // G))[None, :] == np.arange(G)[:, None]
    hosts[1, 0] = hosts[2, 1] = hosts[3, 2] = hosts[0, N - 1] = True     # one replica each
    X = rng.poisson(2.0, (50, N)).astype(float)
    lm = LoadModel(X.sum(axis=0), None, 0.0, G, robust=SemparConfig().robust)
    node_of = np.zeros(G, np.int64)
    before = _served(hosts, Wt, node_of)
    out = balance_pass(hosts, Wt, lm, node_of, before.mean(), 1.0, 50)
    after = _served(out, Wt, node_of)
    assert (out.sum(axis=1) == hosts.sum(axis=1)).all()          # every device keeps its slots
    assert (out.sum(axis=0) == hosts.sum(axis=0)).all()          # every expert its copies
    assert after.max() < before.max() - 1.0 and np.isclose(after.sum(), before.sum())
    # a target at the current peak: nothing to do
    assert (balance_pass(hosts, Wt, lm, node_of, before.max(), 1.0, 50) == hosts).all()


def test_dp_replicas_put_the_hottest_expert_on_every_device():
    trace, _, _ = planted(T=20_000, by_request=True)
    fit, _ = split_by_request(trace, seed=0)
    p = solve("sempar", fit, num_devices=G, mode="dp", redundant=G)
    hosts = p.hosts()                                                   # [L, G, N]
    assert p.slots_per_device == N // G + 1
    for l in range(L):
        hottest = np.bincount(fit.experts[:, l].ravel(), minlength=N).argmax()
        assert hosts[l][:, hottest].all()
        assert (hosts[l].sum(axis=1) == N // G + 1).all()


def test_tp_hot_fallback_where_balance_is_out_of_reach():
    # tiny-mixtral: single experts carry up to 48 % of a layer's activations, so at EP 4 with
    # R = G the replica step leaves the peak above the cap; the fallback puts the hottest expert
    # on every device where that is more balanced on the fit routing
    from sempar.paths import dev_trace_paths
    from sempar.schedule.homes import method_home
    from sempar.trace import read_trace

    path = next(p for p in dev_trace_paths() if p.stem == "tiny-mixtral")
    fit, _ = split_by_request(read_trace(path), seed=0)
    ep = 4

    def fit_imbalance(p):
        return placement_figures(p, fit.experts, method_home(p, fit, "tp"))["imbalance_max_mean"]
    with_ = solve("sempar", fit, num_devices=ep, redundant=ep)
    without = sempar_solve(PlacementProblem(fit, ep, redundant=ep),
                           SemparConfig(tp_hot_fallback=False))
    assert fit_imbalance(with_) < fit_imbalance(without) - 0.05
    hosts = with_.hosts()
    load = np.stack([np.bincount(fit.experts[:, l].astype(np.int64).ravel(), minlength=8)
                     for l in range(fit.meta.num_layers)])
    everywhere = [bool(hosts[l][:, int(load[l].argmax())].all()) for l in range(len(load))]
    assert sum(everywhere) >= len(load) // 2
