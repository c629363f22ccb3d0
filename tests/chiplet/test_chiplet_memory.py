"""On-chip memory accounting of every strategy on cases small enough to count by hand (the module
docstrings of ep.py, hydra.py, naive.py and flow.py give the formulas); EP's single vs double
buffering on a closed-form latency."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.chiplet.ep import contiguous_placement, simulate_ep
from sempar.chiplet.flow import simulate_flow
from sempar.chiplet.hardware import MB, ChipletConfig
from sempar.chiplet.hydra import hydra_homes, hydra_placement
from sempar.chiplet.models import MODELS
from sempar.chiplet.naive import simulate_naive
from sempar.chiplet.workload import Instances

QWEN = MODELS.get("qwen3-30b-a3b")
P = QWEN.expert_params
W = float(P)                                   # int8: one byte per weight
A = QWEN.d_model * 2                           # bf16 activation bytes per token


def fast(**kw) -> ChipletConfig:
    base = dict(ctrl_overhead_s=0.0, xfer_overhead_s=0.0, ddr_latency_s=0.0, fdi_latency_s=0.0,
                hop_latency_s=0.0, d2d_bw=1e18)
    base.update(kw)
    return ChipletConfig(**base)


def one_instance(experts, E, layer=0) -> Instances:
    ex = np.array(experts, np.int16)
    n = ex.shape[0]
    return Instances(ex, np.array([0, n]), np.zeros(n, np.int64), np.array([layer]), np.array([0]),
                     np.ones(n, np.int64), E)


# 8 experts on 4 dies (die d hosts 2d, 2d+1); token i is homed on die i.
#   t0 -> (0, 1): die 0, at home          t1 -> (0, 2): dies 0, 1; one copy to die 0
#   t2 -> (2, 3): die 1, one copy          t3 -> (6, 7): die 3, at home
# active experts per die: 2, 2, 0, 2; copies: 2; (token, expert) pairs: 8.
EP_CASE = [[0, 1], [0, 2], [2, 3], [6, 7]]


@pytest.mark.parametrize("buffers,experts_on_chip", [(1, 3), (2, 6)])
def test_ep_memory_by_hand(buffers, experts_on_chip):
    inst = one_instance(EP_CASE, 8)
    r = simulate_ep(inst, contiguous_placement(8, 4, 1), inst.home(4), ChipletConfig(), QWEN.d_model,
                    P, 1.0, buffers=buffers)
    assert r.peak_bytes[0] == pytest.approx(experts_on_chip * W + (4 + 2 + 8) * A)
    assert r.d2d_bytes[0] == pytest.approx(2 * A)                 # the two replicated copies


def test_ep_single_buffer_serialises_load_and_compute():
    """Dies 0, 1, 3 each run two one-pass experts. The paper's EP (one buffer): load, compute, load,
    compute = 2 (W / bw + t_pass). Double buffering overlaps the second load with the first
    compute: 2 W / bw + t_pass (t_pass < W / bw here)."""
    cfg = fast()
    inst = one_instance(EP_CASE, 8)
    t_load = W / cfg.ddr_bw_per_die
    t_pass = 2 * cfg.lanes * P / cfg.peak_ops
    assert t_pass < t_load
    r1 = simulate_ep(inst, contiguous_placement(8, 4, 1), inst.home(4), cfg, QWEN.d_model, P, 1.0, buffers=1)
    r2 = simulate_ep(inst, contiguous_placement(8, 4, 1), inst.home(4), cfg, QWEN.d_model, P, 1.0, buffers=2)
    assert r1.latency[0] == pytest.approx(2 * (t_load + t_pass), rel=1e-6)
    assert r2.latency[0] == pytest.approx(2 * t_load + t_pass, rel=1e-6)
    with pytest.raises(ValueError):
        simulate_ep(inst, contiguous_placement(8, 4, 1), inst.home(4), cfg, QWEN.d_model, P, 1.0, buffers=3)


def test_hydra_relocation_removes_the_copies_by_hand():
    """2 dies, 2 experts per layer, one token each. Layer 0: t0 -> e0, t1 -> e1 (e0 on die 0, e1 on
    die 1 by load balance). Layer 1: t0 -> e1, t1 -> e0. Hydra puts layer-1 e0 on die 1, where its
    token's layer-0 expert sat, and e1 on die 0; tokens stay on the die of their layer-0 expert, so
    layer 1 needs no copy. Contiguous EP homes t0 on die 0 and t1 on die 1: two copies."""
    ex = np.array([[0], [1], [1], [0]], np.int16)
    inst = Instances(ex, np.array([0, 2, 4]), np.zeros(4, np.int64), np.array([0, 1]), np.array([0, 0]),
                     np.ones(4, np.int64), 2)
    die_of = hydra_placement(inst, 2, 2)
    assert die_of.tolist() == [[0, 1], [1, 0]]
    home = hydra_homes(inst, die_of, 2)
    assert home.tolist() == [0, 1, 0, 1]
    cfg = ChipletConfig(rows=1, cols=2)
    hy = simulate_ep(inst, die_of, home, cfg, QWEN.d_model, P, 1.0)
    ep = simulate_ep(inst, contiguous_placement(2, 2, 2), inst.home(2), cfg, QWEN.d_model, P, 1.0)
    # one active expert per die in both layers: 2 W; tokens (n + copies + n K) a
    assert hy.peak_bytes.tolist() == pytest.approx([2 * W + (2 + 0 + 2) * A] * 2)
    assert ep.peak_bytes.tolist() == pytest.approx([2 * W + (2 + 0 + 2) * A, 2 * W + (2 + 2 + 2) * A])
    assert hy.d2d_bytes[1] == 0 and ep.d2d_bytes[1] == pytest.approx(2 * A)


def test_naive_memory_by_hand():
    """3 experts, 4 dies, 6 tokens. e0: 4 tokens all on die 0 (balanced share 1 each: 3 lent);
    e1: 1 token on die 2 (share goes to die 0: 1 lent); e2 inactive. Two slices of W / 4 per die:
    2 W; tokens 2 (6 + 3) a."""
    counts = np.zeros((1, 3, 4), np.int32)
    counts[0, 0, 0] = 4
    counts[0, 1, 2] = 1
    r = simulate_naive(counts, np.array([6]), ChipletConfig(), QWEN.d_model, P, 1.0)
    assert r.peak_bytes[0] == pytest.approx(2 * W + 2 * (6 + 3) * A)
    single = counts.copy()
    single[0, 1] = 0
    r = simulate_naive(single, np.array([6]), ChipletConfig(), QWEN.d_model, P, 1.0)
    assert r.peak_bytes[0] == pytest.approx(W + 2 * (6 + 3) * A)   # one active expert: one slice each


def test_flow_fills_its_buffer_and_replicates_nothing():
    """DDR-bound (compute and D2D instant), one expert with tokens on every die, 32 micro-slices
    and a buffer of exactly 2 micro-slices per die: Rule 4 keeps every buffer full, so the weights
    peak at D x 2 x W / 32, a sixteenth of one expert; simulate.py adds 2 n a of tokens."""
    M = 32
    cfg = fast(peak_ops=1e21, buffer_bytes=int(np.ceil(2 * W / M)))
    counts = np.ones((1, 1, 4), np.int32)
    r = simulate_flow(counts, cfg, P, 1.0, micro_slices=M)
    assert r.peak_slots[0].tolist() == [2, 2, 2, 2]
    assert r.peak_slots[0].sum() * r.slot_bytes == pytest.approx(4 * 2 * W / M)
    # and never more than the buffer, however many experts stream through
    counts = np.ones((1, 6, 4), np.int32)
    r = simulate_flow(counts, cfg.with_(buffer_bytes=4 * MB), P, 1.0, micro_slices=8)
    assert r.peak_slots.max() <= (4 * MB) // (W / 8)


def test_large_experts_save_over_70_percent_of_ep():
    """FSE-DP's targets on a large-expert model (Phi-3.5 shape, 16 tokens, 8 MiB per die = the
    paper's < 32 MB package): 1.22-2.00x faster than the paper's EP and >= 70% of its peak on-chip
    memory saved. Measured (2 iterations): 1.44x, 150.6 against 21.3 MiB (86% saved)."""
    from sempar.chiplet.simulate import simulate
    from sempar.chiplet.strategies import resolve
    from sempar.chiplet.workload import assemble
    from sempar.trace import TraceMeta
    from sempar.trace.synth import synthesize

    phi = MODELS.get("phi-3.5-moe")
    tr = synthesize(TraceMeta("phi-3.5-moe", phi.layers, phi.experts, phi.top_k, 32000), 2000,
                    requests=20, seed=0)
    r = simulate(assemble(tr, phi, 16, 2), ChipletConfig(buffer_bytes=8 * MB), resolve("ep,fsedp+paired-load"))
    ep, a3 = r["ep"], r["fsedp+paired-load"]
    assert 1.22 <= ep.layer_latency_s / a3.layer_latency_s <= 2.0
    assert 1 - a3.peak_bytes / ep.peak_bytes >= 0.70
    assert ep.peak_bytes >= 4 * phi.expert_params                   # one whole int8 expert per die


def test_buffering_counts_the_deferred_activations():
    """A5's peak is A3's accounting on the rewritten batches plus one copy of the most tokens held
    back at once (buffering.py). Qwen3 shape, 16 tokens, 12 iterations, measured: 30% slack defers
    6 times and holds at most 16 tokens (a whole request); 1% slack never defers and holds none; the
    peak grows by exactly held_max x d_model x 2 B over the same batches without it."""
    from sempar.chiplet.buffering import buffered_instances
    from sempar.chiplet.simulate import simulate
    from sempar.chiplet.strategies import resolve
    from sempar.chiplet.workload import assemble
    from sempar.trace.synth import synthesize

    wl = assemble(synthesize("qwen3-30b-a3b", 4000, requests=40, seed=0), QWEN, 16, 12)
    inst, log = buffered_instances(wl, 0.3)
    assert sum(log.deferrals.values()) > 0 and 0 < log.held_max <= 2 * 16
    _, none = buffered_instances(wl, 0.01)               # N_threshold 100: no opportunity in 12 passes
    assert sum(none.deferrals.values()) == 0 and none.held_max == 0
    r = simulate(wl, ChipletConfig(), resolve("fsedp+paired-load+buffering30"))["fsedp+paired-load+buffering30"]
    slots = simulate_flow(inst.counts(4), ChipletConfig(), P, 1.0, 8, paired=True)
    tokens = 2 * inst.sizes() * A
    assert r.peak_bytes == pytest.approx((slots.peak_slots.sum(axis=1) * slots.slot_bytes + tokens).max()
                                         + log.held_max * A)
