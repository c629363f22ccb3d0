"""sempar.chiplet: closed forms, conservation, memory accounting, Alg. 1 / Alg. 2 invariants and
the strategy ordering FSE-DP reports (measured here first, asserted with margin)."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.chiplet.buffering import buffered_instances, n_threshold
from sempar.chiplet.ep import contiguous_placement, simulate_ep
from sempar.chiplet.flow import auto_micro_slices, micro_slice_slots, simulate_flow
from sempar.chiplet.hardware import MB, ChipletConfig, area_mm2, feasible, mesh_of, power_w
from sempar.chiplet.models import MODELS
from sempar.chiplet.simulate import simulate
from sempar.chiplet.strategies import STRATEGIES, resolve
from sempar.chiplet.trajectory import IdleVector, alg1_schedule, unit_order, visit_table
from sempar.chiplet.workload import Instances, assemble, map_experts, plain_instances
from sempar.errors import InputError
from sempar.trace import TraceMeta, read_trace
from sempar.trace.synth import synthesize

QWEN = MODELS.get("qwen3-30b-a3b")
P = QWEN.expert_params
W = P * 1.0                       # int8 bytes per expert


def fast(**kw) -> ChipletConfig:
    base = dict(ctrl_overhead_s=0.0, xfer_overhead_s=0.0, ddr_latency_s=0.0, fdi_latency_s=0.0, hop_latency_s=0.0)
    base.update(kw)
    return ChipletConfig(**base)


def test_ddr_bound_closed_form():
    """One expert, one token per die, compute and D2D free: FSE-DP spreads the load over the four
    DDR channels (W / (4 bw)); EP loads it through one (W / bw)."""
    cfg = fast(peak_ops=1e21, d2d_bw=1e18)
    counts = np.ones((1, 1, 4), np.int32)
    r = simulate_flow(counts, cfg, P, 1.0, micro_slices=8)
    assert r.latency[0] == pytest.approx(W / (4 * cfg.ddr_bw_per_die), rel=1e-3)
    inst = Instances(np.zeros((4, 1), np.int16), np.array([0, 4]), np.arange(4), np.array([0]),
                     np.array([0]), np.ones(4, np.int64), 1)
    e = simulate_ep(inst, contiguous_placement(1, 4, 1), inst.home(4), cfg, QWEN.d_model, P, 1.0)
    assert e.latency[0] == pytest.approx(W / cfg.ddr_bw_per_die, rel=1e-3)


def test_compute_bound_closed_form():
    """DDR and D2D free: every die computes every micro-slice on its 32 tokens (2 passes of 16)."""
    cfg = fast(ddr_bw_per_die=1e18, d2d_bw=1e18)
    counts = np.full((1, 1, 4), 32, np.int32)
    M = 8
    r = simulate_flow(counts, cfg, P, 1.0, micro_slices=M)
    t_pass = 2 * cfg.lanes * (P / M) / cfg.peak_ops
    assert r.latency[0] == pytest.approx(M * 2 * t_pass, rel=1e-6)
    assert r.busy[0] == pytest.approx(np.full(4, M * 2 * t_pass))


def random_counts(seed=0, B=6, E=12, D=4):
    rng = np.random.default_rng(seed)
    c = rng.poisson(1.2, (B, E, D)).astype(np.int32)
    c[:, rng.random(E) < 0.3, :] = 0
    return c


@pytest.mark.parametrize("paired,rule5", [(False, False), (True, False), (True, True)])
def test_flow_conservation_and_memory(paired, rule5):
    """Every (token, expert) is computed exactly once: each micro-slice visits each die holding tokens
    of its expert once, so busy time is the closed sum; buffer occupancy never exceeds S slots."""
    cfg = ChipletConfig(buffer_bytes=3 * MB)
    counts = random_counts()
    M = 8
    r = simulate_flow(counts, cfg, P, 1.0, M, paired=paired, rule5=rule5, snapshot=2)
    t_pass = 2 * cfg.lanes * (P / M) / cfg.peak_ops
    visits = np.where(counts > 0, M * (-(-counts // cfg.lanes) * t_pass + cfg.ctrl_overhead_s), 0.0)
    assert r.busy.sum(axis=1) == pytest.approx(visits.sum(axis=(1, 2)), rel=1e-9)
    S = micro_slice_slots(cfg, W, M)
    assert r.peak_slots.max() <= S and r.peak_slots.max() >= 1
    # each micro-slice loaded exactly once from DDR
    active = (counts.sum(axis=2) > 0).sum(axis=1)
    assert r.ddr_busy.sum(axis=1) == pytest.approx(active * M * ((W / M) / cfg.ddr_bw_per_die + cfg.xfer_overhead_s))
    # Alg. 1 + rules never run two micro-slices on one die at once (snapshot instance)
    comp = sorted((d, s, e) for k, d, s, e, _ in r.activity if k == "compute")
    assert len(comp) == np.count_nonzero(counts[2]) * M
    for (d1, s1, e1), (d2, s2, e2) in zip(comp, comp[1:]):
        if d1 == d2:
            assert s2 >= e1 - 1e-15


def test_ep_conservation_and_peak_memory():
    rng = np.random.default_rng(3)
    n, K, E, D = 64, 2, 16, 4
    ex = np.stack([rng.choice(E, K, replace=False) for _ in range(n)]).astype(np.int16)
    inst = Instances(ex, np.array([0, n]), np.zeros(n, np.int64), np.array([0]), np.array([0]),
                     np.ones(n, np.int64), E)
    cfg = ChipletConfig()
    r = simulate_ep(inst, contiguous_placement(E, D, 1), inst.home(D), cfg, 2048, P, 1.0, buffers=2)
    tot = np.bincount(ex.ravel().astype(np.int64), minlength=E)
    t_pass = 2 * cfg.lanes * P / cfg.peak_ops
    expect = sum(-(-c // cfg.lanes) * t_pass + cfg.ctrl_overhead_s for c in tot if c)
    assert r.busy.sum() == pytest.approx(expect)
    # two whole experts per die (every die has >= 2 active experts here) + tokens
    assert (np.bincount(np.flatnonzero(tot) * D // E, minlength=D) >= 2).all()
    assert r.peak_bytes[0] >= 2 * D * W
    assert r.peak_bytes[0] - 2 * D * W < 3 * n * K * 2048 * cfg.act_bytes


def test_visit_table_is_a_ring_over_the_mask():
    vis, nv, hop = visit_table(2, 3)
    mesh = mesh_of(2, 3)
    rng = np.random.default_rng(0)
    for _ in range(50):
        a, m = int(rng.integers(6)), int(rng.integers(1, 64))
        seq = [int(x) for x in vis[a, m, :nv[a, m]]]
        assert sorted(seq) == [d for d in range(6) if m >> d & 1]
        pos = [int(mesh.ring_pos[d]) for d in seq]
        rel = [(p - mesh.ring_pos[a]) % 6 for p in pos]
        assert rel == sorted(rel)
        assert hop[a, m, 0] == mesh.hops[a, seq[0]]


def test_alg1_reference_never_double_books_a_die():
    rng = np.random.default_rng(1)
    masks = [int(x) for x in rng.integers(1, 16, 30)]
    dur = list(rng.random(30))
    sched = alg1_schedule(masks, dur, 4)
    assert sorted(d.expert for d in sched) == list(range(30))
    for die in range(4):
        iv = sorted((d.start, d.end) for d in sched if d.mask >> die & 1)
        for (s1, e1), (s2, e2) in zip(iv, iv[1:]):
            assert s2 >= e1 - 1e-12
    icv = IdleVector(4)
    icv.allocate(0b0101)
    assert icv.bits == 0b1010 and icv.first(0b1110) == 1
    icv.release(0b0001)
    assert icv.bits == 0b1011


def test_paired_order_alternates_hot_and_cold():
    totals = np.array([[5, 0, 9, 1, 3, 7]])
    order, w = unit_order(totals, paired=True)
    assert w == 2 and order[0, :5].tolist() == [2, 3, 5, 4, 0] and order[0, 5] == 1
    order, w = unit_order(totals, paired=False)
    assert w == 1 and order[0, :5].tolist() == [0, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def qwen_small():
    tr = synthesize("qwen3-30b-a3b", 4000, requests=40, seed=0)
    return assemble(tr, QWEN, 16, 6)


def test_assembly_and_mapping():
    tr = read_trace("src/sempar/assets/traces/tiny-moe64.parquet")
    wl = assemble(tr, QWEN, 64, 20)
    assert all(it.rows.size == 64 for it in wl.iterations)
    assert wl.experts.shape[1:] == (tr.meta.num_layers, QWEN.top_k)
    assert wl.experts.max() < 128 and wl.experts.min() >= 0
    ex = wl.experts.reshape(-1, QWEN.top_k)
    assert all(len(set(r)) == QWEN.top_k for r in ex[:500].tolist())
    # decode steps appear: requests contribute tokens over several iterations
    spans = {}
    for i, it in enumerate(wl.iterations):
        for r in np.unique(it.request):
            spans.setdefault(int(r), set()).add(i)
    assert max(len(s) for s in spans.values()) >= 3
    phi = MODELS.get("phi-3.5-moe")
    m = map_experts(tr.experts[:100, 0], tr.token_id[:100], 64, phi)
    assert m.shape == (100, 2) and m.max() < 16
    ds = MODELS.get("deepseek-moe-16b")
    m = map_experts(tr.experts[:100, 0], tr.token_id[:100], 64, ds)
    assert m.shape == (100, 8) and (m[:, 6:] == [64, 65]).all()


def test_buffering_respects_qos_and_conserves_tokens(qwen_small):
    plain = plain_instances(qwen_small)
    for slack in (0.1, 0.3):
        inst, log = buffered_instances(qwen_small, slack)
        assert inst.experts.shape[0] == plain.experts.shape[0]          # each token-layer once
        assert np.array_equal(np.bincount(inst.layer, weights=inst.sizes()),
                              np.bincount(plain.layer, weights=plain.sizes()))
        assert log.deadline_ok
        for r, k in log.deferrals.items():
            assert k <= log.passes[r] // n_threshold(slack)
    assert sum(log.deferrals.values()) > 0


def test_strategy_ordering_reference(qwen_small):
    """Qwen3-30B-A3B shape, synthetic routing, 16 tokens/iter (FSE-DP's low-batch case).
    Measured: FSE-DP+paired-load 1.37x the paper's EP (ep-db 1.16x), Hydra 0.96x EP; peak memory
    20.4 MiB against 18.75 (ep: one 4.5 MiB expert per die) and 36.75 MiB (ep-db): with experts this
    small FSE-DP's 16 MiB/die buffer holds as much as EP; the saving is on large experts
    (test_chiplet_memory)."""
    r = simulate(qwen_small, ChipletConfig(), resolve("ep,ep-db,hydra,fsedp+paired-load,fsedp-naive"))
    ep = r["ep"].layer_latency_s
    assert ep / r["fsedp+paired-load"].layer_latency_s > 1.22
    assert ep / r["ep-db"].layer_latency_s > 1.05
    assert 0.75 < ep / r["hydra"].layer_latency_s < 1.15
    assert r["fsedp+paired-load"].peak_bytes < 0.75 * r["ep-db"].peak_bytes
    assert r["ep"].peak_bytes == pytest.approx(r["ep-db"].peak_bytes - 4 * W, rel=1e-9)
    assert r["fsedp+paired-load"].utilization > r["ep"].utilization
    assert r["ep"].e2e_latency_s > r["fsedp+paired-load"].e2e_latency_s


def test_paired_load_gains_most_at_low_tokens_when_the_buffer_binds():
    """FSE-DP §VI-B/C: paired-load helps most at low token counts. Ours shows it only where the
    buffer limits prefetch: Yuan2.0 shape, 4 MiB/die, 16 micro-slices. Measured (4 iterations):
    A3/A2 = 1.18 at 16 tokens, 1.03 at 256."""
    yuan = MODELS.get("yuan2.0-m32")
    tr = synthesize(TraceMeta("yuan2.0-m32", yuan.layers, yuan.experts, yuan.top_k, 32000), 3000,
                    requests=20, seed=0)
    gain = {}
    for T in (16, 256):
        r = simulate(assemble(tr, yuan, T, 4), ChipletConfig(buffer_bytes=4 * MB),
                     resolve("fsedp,fsedp+paired-load"), micro_slices=16)
        gain[T] = r["fsedp"].layer_latency_s / r["fsedp+paired-load"].layer_latency_s
    assert gain[16] > 1.08 and gain[16] > gain[256] + 0.05


def test_limits_and_auto_slices():
    cfg = ChipletConfig()
    assert feasible(cfg)
    assert not feasible(cfg.with_(ddr_bw_per_die=64e9))                 # eq. 2: DDR power
    assert not feasible(cfg.with_(buffer_bytes=48 * MB))                # eq. 1: area
    assert area_mm2(cfg.with_(d2d_bw=512e9)) > area_mm2(cfg)
    assert power_w(cfg) < 60
    phi = MODELS.get("phi-3.5-moe")
    assert auto_micro_slices(cfg, phi.expert_params) == 32
    assert auto_micro_slices(cfg, W) == 8
    with pytest.raises(InputError):
        micro_slice_slots(cfg.with_(buffer_bytes=MB), phi.expert_params, 8)
    with pytest.raises(InputError):
        ChipletConfig(rows=5, cols=5)
    assert "fsedp+paired-load+buffering20" in STRATEGIES and len(resolve("all")) == len(STRATEGIES)
    assert resolve("A3,+rule5")[1].rule5
    with pytest.raises(InputError):
        resolve("nope")


def test_sweeps_scaling_and_limits(qwen_small):
    """Fig. 18: EP's utilization falls from 2x2 to 4x4 while FSE-DP stays far above it (measured
    on 2 iterations: EP 0.14 / 0.12 / 0.10, FSE-DP 0.30 / 0.35 / 0.36); Fig. 16: eqs. 1-2 mark
    the fast-DDR corner infeasible."""
    from sempar.chiplet import sweeps as sw
    wl = type(qwen_small)(qwen_small.model, 16, qwen_small.iterations[:2], qwen_small.experts,
                          row_index=qwen_small.row_index, trace_layers=qwen_small.trace_layers)
    sc = sw.scaling(wl, ChipletConfig())
    ep, fse = sc["utilization"]["ep"], sc["utilization"]["fsedp+paired-load"]
    assert ep[2] < ep[0] and min(fse) > 2 * max(ep)
    g = sw.buffer_x_ddr(wl, ChipletConfig(), buffers=(8, 16), ddr=(25.6, 64.0))
    assert g["feasible"] == [[True, False], [True, False]]
    u = np.array(g["utilization"])
    assert (u[:, 1] > u[:, 0]).all()                      # more DDR bandwidth, higher utilization
