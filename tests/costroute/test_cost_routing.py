"""Cost-aware routing (CAMoE §3.4): tables (eqs. 10-13), the router hook, the controller, the sweep."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from sempar.comm.topology import Topology
from sempar.comm.topology_presets import load_topology
from sempar.errors import InputError
from sempar.costroute.controller import LambdaController, bottleneck_pairs, refresh_links
from sempar.costroute.cost_bias import (TokenBytes, a2a_layer_seconds, build_tables,
                                      destination_table, dispatch_counts, link_cost_share,
                                      traffic_weighted_cost, unit_bias, zscore_row)
from sempar.costroute.metrics import kl, pareto, routing_shift

# ----------------------------------------------------------------------------- tables


def two_device_topology() -> Topology:
    alpha = np.zeros((3, 2, 2))
    alpha[1] = [[0, 2], [4, 0]]          # dispatch
    alpha[2] = [[0, 1], [1, 0]]          # combine
    beta = np.zeros((3, 2, 2))
    beta[1, 0, 1] = 1e-3                 # dispatch 0 -> 1 costs 1 ms per byte
    return Topology("toy2", np.array([0, 1]), alpha, beta)


def test_zscore_row_hand_cases():
    z = zscore_row(np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]))
    s = np.sqrt(2.0 / 3.0)                               # population std of 1, 2, 3
    np.testing.assert_allclose(z[0], [-1 / s, 0, 1 / s], rtol=1e-9)
    np.testing.assert_array_equal(z[1], [0, 0, 0])     # equal costs: no preference, no NaN
    np.testing.assert_allclose(zscore_row(np.array([[0.0, 3.0, 9.0]])),
                               [[-1.0690449676, -0.2672612419, 1.3363062096]], rtol=1e-9)


def test_gate_bias_matches_hand_computation():
    topo = two_device_topology()
    nb = TokenBytes(dispatch=2.0, combine=1.0, metadata=8.0)
    n = np.array([[[0.0, 1000.0], [0.0, 0.0]]])        # one layer: 1000 activations 0 -> 1
    c = traffic_weighted_cost(topo, n, nb)
    # C[0,1] = alpha_d 2 + beta_d 1e-3 * 2000 B + alpha_c[1,0] 1 = 5; C[1,0] = 4 + 1 = 5
    np.testing.assert_allclose(c[0], [[0, 5], [5, 0]])
    hosts = np.zeros((1, 2, 4), bool)
    hosts[0, 0, :2] = hosts[0, 1, 2:] = True           # experts 0, 1 on device 0; 2, 3 on 1
    unit = unit_bias(c, hosts)
    np.testing.assert_allclose(unit[0], [[1, 1, -1, -1], [-1, -1, 1, 1]], atol=1e-6)
    t = build_tables(topo, hosts, n, nb)
    np.testing.assert_allclose(t.at(0.1)[0], 0.1 * unit[0], atol=1e-7)
    assert t.at(0.0).max() == 0 and t.nbytes_fp16() == 16
    # eq. 13 as written, -lambda * C^ M^T, on a 3-device case without replicas
    c3 = np.array([[[0.0, 1.0, 5.0], [2.0, 0.0, 2.0], [9.0, 3.0, 0.0]]])
    h3 = np.zeros((1, 3, 3), bool)
    h3[0, [0, 1, 2], [2, 0, 1]] = True                 # expert 2 on dev 0, 0 on 1, 1 on 2
    M = h3[0].T.astype(float)                          # M[e, v]
    np.testing.assert_allclose(unit_bias(c3, h3)[0], -zscore_row(c3[0]) @ M.T, atol=1e-6)
    with pytest.raises(InputError):
        t.at(-0.1)


def test_dispatch_counts_and_dedup():
    hosts = np.zeros((1, 2, 4), bool)
    hosts[0, 0, :2] = hosts[0, 1, 2:] = True
    dest = destination_table(hosts)
    experts = np.array([[[0, 2]], [[2, 3]], [[1, 3]]])  # T=3, L=1, k=2
    home = np.array([0, 0, 1])
    n = dispatch_counts(experts, home, dest)
    np.testing.assert_array_equal(n[0], [[1, 3], [1, 1]])
    nd = dispatch_counts(experts, home, dest, dedup=True)
    np.testing.assert_array_equal(nd[0], [[1, 2], [1, 1]])   # token 1 sends one copy to dev 1
    with pytest.raises(InputError):
        dispatch_counts(experts + 4, home, dest)


def test_replica_goes_to_cheapest_device():
    topo = load_topology("pcie-upi8")
    hosts = np.zeros((1, 8, 8), bool)
    hosts[0, np.arange(8), np.arange(8)] = True
    hosts[0, 1, 5] = True                               # expert 5 also on device 1 (socket 0)
    dest = destination_table(hosts, topo)
    assert dest[0, 0, 5] == 1 and dest[0, 6, 5] == 5 and dest[0, 5, 5] == 5


def test_a2a_time_eq9():
    topo = two_device_topology()
    nb = TokenBytes(dispatch=2.0, combine=1.0, metadata=8.0)
    n = np.array([[[7.0, 1000.0], [16.0, 9.0]]])
    t = a2a_layer_seconds(topo, n, nb)
    # metadata: alpha_m is 0 and beta_m 0 -> 0; dispatch: max(2 + 1e-3 * 2000, 4 + 0) = 4;
    # combine travels back (1 -> 0 with 1000 B, 0 -> 1 with 16 B): alpha_c = 1 either way
    assert t["metadata"][0] == 0 and t["dispatch"][0] == pytest.approx(4.0)
    assert t["combine"][0] == pytest.approx(1.0) and t["total"][0] == pytest.approx(5.0)
    # expensive: pair cost above the midpoint of 2.002 (0 -> 1) and 4 (1 -> 0)
    assert link_cost_share(topo, n, nb) == pytest.approx(16 / 1032)


# ----------------------------------------------------------------------------- hook

@pytest.fixture(scope="module")
def tiny():
    from sempar.models import load_model

    return {name: load_model(name) for name in ("tiny-mixtral", "tiny-moe64")}


def _ids(seed=0, B=2, S=48):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 8000, (B, S), generator=g)


def _forward(model, ids):
    import torch

    from sempar.costroute.hook import router_sites
    from sempar.trace.routers import RoutingCapture

    _, sites = router_sites(model)
    m = sites[0].module
    with RoutingCapture(sites, m.top_k, m.num_experts) as cap, torch.no_grad():
        cap.expect(ids.numel())
        logits = model(input_ids=ids, use_cache=False).logits
        experts, weights = cap.take()
    return logits, experts, weights


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-moe64"])
def test_lambda_zero_is_bit_identical_and_restored(tiny, name):
    from sempar.costroute.hook import CostRoutingHook

    model, ids = tiny[name], _ids()
    ref = _forward(model, ids)
    L, E = ref[1].shape[1], int(model.config.num_experts if name == "tiny-moe64"
                                 else model.config.num_local_experts)
    for passthrough in (True, False):   # False runs our re-implementation with a zero table
        with CostRoutingHook(model, np.zeros((L, 8, E), np.float32),
                             passthrough_at_zero=passthrough) as hook:
            got = _forward(model, ids)
        for a, b in zip(ref, got):
            assert np.array_equal(np.asarray(a), np.asarray(b))
        assert all("forward" not in s.module.__dict__ for s in hook.sites)
    rng = np.random.default_rng(0)
    try:
        with CostRoutingHook(model, rng.normal(size=(L, 8, E)).astype(np.float32)):
            assert not np.array_equal(_forward(model, ids)[1], ref[1])
            raise KeyError("boom")
    except KeyError:
        pass
    after = _forward(model, ids)                     # restored after an exception too
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(ref, after))


def test_other_families_zero_bias_bit_identical():
    """Our copies of the qwen2_moe / olmoe / gpt_oss / deepseek_v3 routers match transformers."""
    import torch
    import transformers as tf

    from sempar.costroute.hook import CostRoutingHook

    common = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=64)
    configs = [
        tf.Qwen2MoeConfig(**common, intermediate_size=32, moe_intermediate_size=16, num_experts=8,
                          shared_expert_intermediate_size=16),
        tf.OlmoeConfig(**common, intermediate_size=16, num_experts=8),
        tf.GptOssConfig(**common, intermediate_size=16, num_local_experts=8, head_dim=16,
                        layer_types=["full_attention"] * 2),
        tf.DeepseekV3Config(**common, intermediate_size=32, moe_intermediate_size=16,
                            n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1,
                            first_k_dense_replace=0, q_lora_rank=16, kv_lora_rank=16,
                            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8),
    ]
    for cfg in configs:
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(cfg).eval()
        for n, p in model.named_parameters():      # zeros-initialised routers: make them real
            if "gate" in n or "router" in n:
                torch.nn.init.normal_(p, std=0.5)
        ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = model(input_ids=ids, use_cache=False).logits
            hook = CostRoutingHook(model, None, passthrough_at_zero=False)
            E = int(hook.sites[0].module.num_experts)
            hook.set_table(np.zeros((len(hook.sites), 2, E), np.float32))
            with hook:
                got = model(input_ids=ids, use_cache=False).logits
            assert torch.equal(ref, got), cfg.model_type
            with CostRoutingHook(model, np.full((len(hook.sites), 2, E), 3.0, np.float32)
                                 * (np.arange(E) < E // 2), mode="select"):
                shifted = model(input_ids=ids, use_cache=False).logits
            assert not torch.equal(ref, shifted), cfg.model_type


def test_unsupported_model_and_bad_tables(tiny):
    import torch

    from sempar.costroute.hook import CostRoutingHook

    with pytest.raises(InputError, match="cost-aware routing supports"):
        CostRoutingHook(torch.nn.Linear(2, 2), None)
    with pytest.raises(InputError, match="do not fit"):
        CostRoutingHook(tiny["tiny-mixtral"], np.zeros((3, 8, 8), np.float32))
    with pytest.raises(InputError, match="mode"):
        CostRoutingHook(tiny["tiny-mixtral"], None, mode="bogus")


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-moe64"])
def test_routing_shifts_toward_cheap_devices(tiny, name):
    """pcie-upi8, vanilla EP 8, homes = row mod 8: the share of activations crossing the UPI
    (expensive) link falls strictly as lambda grows, and more activations stay local."""
    from sempar.costroute.hook import CostRoutingHook

    model = tiny[name]
    topo = load_topology("pcie-upi8")
    ids = _ids(seed=3, B=4, S=64)
    base = _forward(model, ids)[1]
    L, E = base.shape[1], (64 if name == "tiny-moe64" else 8)
    hosts = np.zeros((L, 8, E), bool)
    for g in range(8):
        hosts[:, g, g * E // 8:(g + 1) * E // 8] = True
    home = np.arange(ids.numel()) % 8
    nb = TokenBytes.for_model(128, base.shape[2], E)
    dest = destination_table(hosts, topo)
    tables = build_tables(topo, hosts, dispatch_counts(base, home, dest), nb, dest)
    shares, local = [], []
    for lam in (0.0, 0.25, 0.5, 1.0, 2.0):
        with CostRoutingHook(model, tables.at(lam)) as hook:
            hook.set_sources(home)
            ex = _forward(model, ids)[1]
        n = dispatch_counts(ex, home, dest)
        shares.append(link_cost_share(topo, n, nb))
        local.append(np.trace(n, axis1=1, axis2=2).sum() / n.sum())
    assert all(a > b for a, b in zip(shares, shares[1:])), shares
    assert local[-1] > local[0]


# ----------------------------------------------------------------------------- metrics, controller

def test_routing_shift_and_pareto():
    c = np.array([[10, 20, 30, 40], [5, 5, 5, 5]])
    s0 = routing_shift(c, c)
    assert s0["kl"] == 0 and s0["avg_layer_kl"] == 0
    assert s0["avg_layer_cv"] == pytest.approx((np.std([10, 20, 30, 40]) / 25 + 0) / 2)
    assert kl([1, 3], [1, 1]) == pytest.approx(0.25 * np.log(0.5) + 0.75 * np.log(1.5), rel=1e-6)
    pts = [{"lambda": 0.0, "a2a_mean_s": 10, "acc_mean": 0.5},
           {"lambda": 0.1, "a2a_mean_s": 9, "acc_mean": 0.499},
           {"lambda": 0.2, "a2a_mean_s": 8, "acc_mean": 0.48},
           {"lambda": 0.3, "a2a_mean_s": 8.5, "acc_mean": 0.47}]
    for p in pts:
        p.update(a2a_mean_change=p["a2a_mean_s"] / 10 - 1, a2a_p95_change=0.0, ppl_change=0.0,
                 acc_change_points=100 * (p["acc_mean"] - 0.5))
    par = pareto(pts, max_acc_loss=1.2)
    assert par["lambda"] == 0.1 and par["front"] == [0.0, 0.1, 0.2]
    assert pareto(pts, max_acc_loss=5)["lambda"] == 0.2


def test_controller_converges_and_guards():
    ctl = LambdaController(target_seconds=9.0, gain=0.2)
    steps = ctl.run(lambda lam: (10.0 * (1 - 0.5 * lam), 10.0 * (1 - 0.5 * lam), None), 60)
    assert ctl.lam == pytest.approx(0.2, abs=0.02) and not steps[-1].refresh
    guarded = LambdaController(target_seconds=1.0, lam=0.4, kl_budget=0.01)
    s = guarded.update(5.0, 5.0, kl=0.05)
    assert s.reason == "kl-guard" and s.lam == pytest.approx(0.2)
    drift = LambdaController(target_seconds=1.0, ema=1.0)
    assert drift.update(2.0, 1.0).refresh
    with pytest.raises(InputError):
        LambdaController(target_seconds=0)
    topo = two_device_topology()
    assert bottleneck_pairs(topo, np.array([[0, 3000.0], [1.0, 0]]), 2.0, top=1) == [(0, 1)]
    new = refresh_links(topo, {(0, 1): (1000.0, 4.0)})
    assert new.beta[1, 0, 1] == pytest.approx(2e-3) and topo.beta[1, 0, 1] == 1e-3


# ----------------------------------------------------------------------------- sweep + CLI

@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("cr")
    words = "the quick brown fox jumps over the lazy dog while def main(): return x + 1".split()
    rng = np.random.default_rng(0)
    for name in ("prose", "code"):
        (d / f"{name}.txt").write_text(" ".join(rng.choice(words, 600)))
    return d


def test_sweep_end_to_end(tiny, texts, tmp_path):
    from sempar.costroute.report import pareto_plot
    from sempar.costroute.sweep import SweepConfig, run_sweeps

    cfg = SweepConfig(model="tiny-mixtral", topologies=("pcie-upi8", "hetero-cloud"), ep=8,
                      lambdas=(0.3,), tokens_per_domain=256, seq_len=64, batch_size=4,
                      texts=(str(texts / "prose.txt"), str(texts / "code.txt")))
    res = run_sweeps(cfg, model=tiny["tiny-mixtral"])
    assert [r["topology"] for r in res] == ["pcie-upi8", "hetero-cloud"]
    for r in res:
        p0, p1 = r["points"]
        assert p0["lambda"] == 0 and p0["kl"] == 0 and p0["a2a_mean_change"] == 0
        assert p1["kl"] > 0 and p1["local_rate"] > p0["local_rate"]
        assert set(p0["quality"]) == {"prose", "code"} and r["forwards"] == 2
        assert r["pareto"]["lambda"] in (0.0, 0.3) and len(p0["layers"]) == 6
        json.dumps(r)
    assert pareto_plot(res, tmp_path / "p.png").stat().st_size > 5000


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sempar.cli", "cost-route", *args],
                          capture_output=True, text=True)


@pytest.mark.parametrize("args,needle", [
    (["--ep", "4"], "--ep is 4"),
    (["--lambdas", "0,-0.1"], "--lambdas"),
    (["--lambdas", "a,b"], "--lambdas"),
    (["--topology", "nowhere"], "topology"),
    (["--model", "no-such-model"], "--model"),
    (["--mode", "x"], "--mode"),
])
def test_cli_bad_input(texts, args, needle):
    r = _cli("sweep", "--text", str(texts / "prose.txt"), *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and r.stdout == ""


def test_cli_json(texts):
    r = _cli("sweep", "--model", "tiny-mixtral", "--topology", "pcie-upi8", "--lambdas", "0,0.5",
             "--text", str(texts / "prose.txt"), "--tokens-per-domain", "128", "--seq-len", "32",
             "--batch-size", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["sweeps"][0]["points"][1]["lambda"] == 0.5 and "pareto" in d["sweeps"][0]


def test_select_mode_keeps_unbiased_weights(tiny):
    """mode="select": the bias picks the experts, the weights are the unbiased softmax at them."""
    import torch

    from sempar.families import MIXTRAL
    from sempar.costroute.hook import route, router_sites

    _, sites = router_sites(tiny["tiny-mixtral"])
    router = sites[0].module
    h = torch.randn(10, router.hidden_dim, generator=torch.Generator().manual_seed(0))
    bias = torch.zeros(10, router.num_experts)
    bias[:, 7] = 50.0                                   # force expert 7 into every top-2
    logits_b, w_sel, idx_sel = route(MIXTRAL, router, h, lambda z: bias, "select")
    _, w_log, idx_log = route(MIXTRAL, router, h, lambda z: bias, "logits")
    assert torch.equal(idx_sel, idx_log) and (idx_sel == 7).any(dim=1).all()
    probs = torch.softmax(torch.nn.functional.linear(h, router.weight).float(), dim=-1)
    want = probs.gather(1, idx_sel)
    torch.testing.assert_close(w_sel, want / want.sum(-1, keepdim=True))
    assert (w_log[idx_log == 7] > 0.99).all()           # CAMoE mode: the bias dominates weights
    torch.testing.assert_close(logits_b, torch.nn.functional.linear(h, router.weight) + bias)


def test_cli_tables(texts, tmp_path):
    out = tmp_path / "t.json"
    r = _cli("tables", "--model", "tiny-mixtral", "--topology", "pcie-upi8", "--text",
             str(texts / "code.txt"), "--tokens-per-domain", "128", "--seq-len", "32",
             "--batch-size", "4", "--out", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    unit = np.asarray(d["unit"])
    assert unit.shape == (6, 8, 8)
    # every row of the z-scored costs has mean 0, so each source's biases sum to ~0 (1 expert
    # per device), and the local expert gets the largest bias (local costs 0)
    np.testing.assert_allclose(unit.sum(axis=2), 0, atol=1e-5)
    assert (unit.argmax(axis=2) == np.arange(8)).all()
