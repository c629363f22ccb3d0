"""Per-pair volumes against the papers' closed forms (s-MoE §3.2, ExFlow Table I)."""

import numpy as np
import pytest

from sempar.comm.collectives import dedup_targets, pair_counts, ring_pairs, ring_seconds
from sempar.comm.pipelines import PIPELINES, pipeline_names
from sempar.comm.simulate import SimOptions, simulate
from sempar.comm.topology import Topology
from sempar.comm.topology_presets import topology_preset
from sempar.schedule.homes import home_tp_contiguous
from sempar.placement.placement import Placement

G = 8


def vanilla(L, N, G=G):
    return Placement(np.tile(np.arange(N), (L, 1)), N, G)


def per_device(result, T, H, phases=("dispatch", "combine", "collectives")):
    """Volume in units of B*S token activations per device (s-MoE §3.2's unit)."""
    return sum(result["total"]["bytes_by_phase"][p] for p in phases) / (G * T * H)


def opts(**kw):
    return SimOptions(hidden=64, dtype_bytes=1, meta_bytes=0, count_bytes=0, **kw)


def routing_with_lar(T, L, k, alpha, rng):
    """experts[T, L, k] on a contiguous placement of N = G * k experts (k per device): the
    first round(alpha * k) experts of each token on its home, the rest on distinct other devices."""
    home = home_tp_contiguous(T, G, L)
    n_loc = int(round(alpha * k))
    ex = np.empty((T, L, k), np.int32)
    for l in range(L):
        h = home[:, l]
        ex[:, l, :n_loc] = h[:, None] * k + np.arange(n_loc)
        others = (h[:, None] + 1 + np.arange(k - n_loc)[None, :]) % G      # distinct devices
        ex[:, l, n_loc:] = others * k + rng.integers(0, k, (T, k - n_loc))
    return ex, home


def test_ring_pairs_and_seconds():
    X = 1000.0
    assert ring_pairs("AR", G, X).sum() == pytest.approx(G * 2 * (G - 1) / G * X)
    assert ring_pairs("RS", G, X)[3, 4] == pytest.approx((G - 1) / G * X)
    t = Topology("h", np.zeros(G), np.full((G, G), 1e-6), np.full((G, G), 1e-9))
    assert ring_seconds(t, "AR", np.array([X]))[0] == pytest.approx(2 * (G - 1) * (1e-6 + 1e-9 * X / G))
    assert ring_seconds(t, "AG", np.array([0.0]))[0] == 0


def test_pair_counts_and_dedup():
    src = np.array([0, 0, 1])
    dst = np.array([[1, 1, 0], [2, 1, 2], [1, 1, 1]])
    base = np.array([0, 0, 9])                                   # token 2 in batch 1 (G = 3)
    c = pair_counts(src, dst, base, 2, 3)
    assert c[0].tolist() == [[0, 3, 2], [0, 0, 0], [0, 0, 0]] and c[1].sum() == 0
    d = pair_counts(src, dedup_targets(src, dst), base, 2, 3)
    assert d[0].tolist() == [[0, 2, 1], [0, 0, 0], [0, 0, 0]]      # per token, distinct devices
    r = pair_counts(src, dst, base, 2, 3, reverse=True)
    assert np.array_equal(r[0], c[0].T)


def test_ds_moe_closed_form_uniform_routing():
    # s-MoE §3.2: DS-MoE = AR + 2 A2A (LAR 1/G) + AG = BS(3 - 1/G - 2/G^2) (written for k = 1)
    rng = np.random.default_rng(0)
    T, L, N = 2048 * 8, 4, 64
    ex = rng.integers(0, N, (T, L, 1))
    home = home_tp_contiguous(T, G, L)
    topo = topology_preset("nvlink8")
    r = simulate(ex, home, vanilla(L, N), topo, PIPELINES.get("ds-moe"), opts())
    assert per_device(r, T * L, 64) == pytest.approx(3 - 1 / G - 2 / G**2, rel=0.01)
    # general k: 3(G-1)/G + 2k(G-1)/G^2 (the closed form's intermediate step)
    k = 6
    ex = rng.integers(0, N, (T, L, k))
    r = simulate(ex, home, vanilla(L, N), topo, PIPELINES.get("ds-moe"), opts())
    assert per_device(r, T * L, 64) == pytest.approx(3 * (G - 1) / G + 2 * k * (G - 1) / G**2,
                                                     rel=0.01)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_smoe_closed_form_exact(alpha):
    # s-MoE §3.2: SRS -> A2A -> A2A = BS(1 + (2k(1 - alpha) - 1)/G), exactly for a controlled LAR
    k, T, L = 6, 2048 * 4, 3
    ex, home = routing_with_lar(T, L, k, alpha, np.random.default_rng(1))
    topo = topology_preset("nvlink8")
    pl = vanilla(L, G * k)
    smoe = PIPELINES.get("semmoe-tp")
    assert smoe is PIPELINES.get("smoe")
    r = simulate(ex, home, pl, topo, smoe, opts(dedup=False, count_sag=False))
    assert r["total"]["lar_mean"] == pytest.approx(round(alpha * k) / k)
    assert per_device(r, T * L, 64) == pytest.approx(1 + (2 * k * (1 - alpha) - 1) / G, rel=1e-12)
    # counting the shuffled AG adds one ring AG: (G - 1)/G
    r2 = simulate(ex, home, pl, topo, smoe, opts(dedup=False))
    assert per_device(r2, T * L, 64) == pytest.approx(2 - 2 / G + 2 * k * (1 - alpha) / G)


def test_saving_ranges_of_smoe():
    # G = 8, k = 6 (DeepSeek-V2): against DS-MoE 16%-69%, against SGLang 32%-75% (design.md)
    k, T, L = 6, 2048 * 4, 2
    topo = topology_preset("nvlink8")
    rng = np.random.default_rng(2)
    ds = per_device(simulate(rng.integers(0, 64, (T, L, 1)), home_tp_contiguous(T, G, L),
                             vanilla(L, 64), topo, PIPELINES.get("ds-moe"), opts()), T * L, 64)
    sg = per_device(simulate(rng.integers(0, 64, (T, L, k)), None, vanilla(L, 64), topo,
                             PIPELINES.get("sglang-tp"), opts()), T * L, 64)
    assert sg == pytest.approx(4 * (G - 1) / G)
    saving = {}
    for alpha in (0.0, 1.0):
        ex, home = routing_with_lar(T, L, k, alpha, rng)
        s = per_device(simulate(ex, home, vanilla(L, G * k), topo, PIPELINES.get("smoe"),
                                opts(dedup=False, count_sag=False)), T * L, 64)
        saving[alpha] = (1 - s / ds, 1 - s / sg)
    assert saving[0.0][0] == pytest.approx(0.165, abs=0.01) and saving[1.0][0] == pytest.approx(0.692, abs=0.01)
    assert saving[0.0][1] == pytest.approx(0.321, abs=0.005) and saving[1.0][1] == pytest.approx(0.75, abs=0.005)


@pytest.mark.parametrize("k", [1, 2])
def test_exflow_table_one(k):
    # ExFlow Table I: top-1 G*N*(L*p* + G), top-2 G*N*(2*L*p* + G) token transfers, with G - 1
    # for the all-gather's G (a device does not send to itself)
    rng = np.random.default_rng(3)
    T, L, N = 2048 * 2, 6, 32
    ex = np.stack([rng.permutation(N)[:k] for _ in range(T * L)]).reshape(T, L, k)
    home = np.repeat((np.arange(T) % G)[:, None], L, axis=1)
    r = simulate(ex, home, vanilla(L, N), topology_preset("a100x4-ib"), PIPELINES.get("exflow"),
                 opts(partial_combine=False))
    p_star = 1 - r["total"]["lar_mean"]                          # share of copies that move
    moved = per_device(r, 1, 64, ("dispatch", "combine", "collectives")) * G
    assert moved == pytest.approx(T * (k * L * p_star + G - 1), rel=1e-12)
    if k == 2:                                                   # partial combine: Table I leaves it out
        r2 = simulate(ex, home, vanilla(L, N), topology_preset("a100x4-ib"),
                      PIPELINES.get("exflow"), opts())
        extra = r2["total"]["bytes_by_phase"]["combine"] / 64
        assert 0 < extra <= T * L


def test_exflow_prefill_context_and_size_exchanges():
    """exflow-prefill: per layer and batch an all-gather of every held token (H + index bytes to
    each of the G - 1 others) and two size exchanges (context, dispatch) of size_bytes per pair;
    its dispatch and combine are exflow's with one-shot dedup plus the index per copy."""
    rng = np.random.default_rng(5)
    T, L, N, k, B = 3000, 3, 32, 2, 1024
    ex = np.stack([rng.permutation(N)[:k] for _ in range(T * L)]).reshape(T, L, k)
    home = np.repeat((np.arange(T) % G)[:, None], L, axis=1)
    topo = topology_preset("a100x4-ib")
    o = opts(batch=B, size_bytes=8, index_bytes=4)
    pre = simulate(ex, home, vanilla(L, N), topo, PIPELINES.get("exflow-prefill"), o)
    ref = simulate(ex, home, vanilla(L, N), topo, PIPELINES.get("exflow"),
                   opts(batch=B, dedup=True, one_shot=True))
    nb = -(-T // B)
    pairs = nb * G * (G - 1)
    for lp, lr in zip(pre["layers"], ref["layers"]):
        ph = lp["bytes_by_phase"]
        assert ph["collectives"] == T * (G - 1) * (64 + 4) + pairs * 8
        assert ph["metadata"] == pairs * 8
        assert ph["dispatch"] == lr["bytes_by_phase"]["dispatch"] / 64 * (64 + 4)
        assert ph["combine"] == lr["bytes_by_phase"]["combine"]
        assert lp["seconds_by_phase"]["collectives"] > 0
    # the papers' models charge no size exchange: size_bytes 0 leaves the one-shot metadata empty
    sg = simulate(ex, home, vanilla(L, N), topo, PIPELINES.get("sglang-ep"), opts(batch=B))
    assert sg["total"]["bytes_by_phase"]["metadata"] == 0


def test_dedup_cuts_copies_and_registry():
    assert pipeline_names() == ["ds-moe", "sglang-tp", "smoe", "smoe-exact", "attn-dp", "sglang-ep",
                                "exflow", "exflow-prefill"]
    rng = np.random.default_rng(4)
    T, L, N, k = 4096, 2, 16, 8                                  # 2 experts per device: duplicates
    ex = np.stack([rng.permutation(N)[:k] for _ in range(T * L)]).reshape(T, L, k)
    home = np.repeat((np.arange(T) % G)[:, None], L, axis=1)
    topo = topology_preset("pcie-upi8")
    a = simulate(ex, home, vanilla(L, N), topo, PIPELINES.get("attn-dp"), opts())
    b = simulate(ex, home, vanilla(L, N), topo, PIPELINES.get("sglang-ep"), opts())
    assert a["total"]["lar_mean"] == b["total"]["lar_mean"]
    no_dedup = a["total"]["bytes_by_phase"]["dispatch"] / 64 / (T * L)
    assert no_dedup == pytest.approx(k * (1 - a["total"]["lar_mean"]))
    dd = b["total"]["bytes_by_phase"]["dispatch"] / 64 / (T * L)
    assert dd == pytest.approx(b["total"]["remote_copies_per_token"]) and dd < no_dedup
    assert b["total"]["a2a_seconds_mean"] < a["total"]["a2a_seconds_mean"]


@pytest.mark.parametrize("G_, replicas", [(4, False), (8, False), (8, True), (12, False),
                                          (12, True), (70, False)])
def test_route_counts_match_brute_force(G_, replicas):
    from sempar.comm.collectives import route_counts

    rng = np.random.default_rng(G_)
    T, k, N, nb = 3000, 5, 2 * G_ + 3, 3
    experts = rng.integers(0, N, (T, k))
    src = rng.integers(0, G_, T).astype(np.int32)
    batch = np.sort(rng.integers(0, nb, T))
    if replicas:
        table = rng.integers(0, G_, (G_, N))                     # replica per (home, expert)
        serve = table[src[:, None], experts]
    else:
        table = rng.integers(0, G_, N)
        serve = table[experts]
    cnt, dd, local = route_counts(src, experts, table, replicas, batch, nb, G_)
    base = batch * G_ * G_
    assert np.array_equal(cnt, pair_counts(src, serve, base, nb, G_))
    assert np.array_equal(dd, pair_counts(src, dedup_targets(src, serve), base, nb, G_))
    assert local == int((serve == src[:, None]).sum())


def test_nearest_replica_follows_the_topology():
    from sempar.comm.simulate import replica_table

    # 8 devices x 2 slots, 15 experts: expert 0 on devices 1 and 5 (one per pcie-upi8 socket)
    rows = [[0, 1], [0, 2], [3, 4], [5, 6], [7, 8], [0, 9], [10, 11], [12, 13]]
    rows[0] = [14, 1]
    pl = Placement(np.array([sum(rows, [])]), 15, 8)
    table, by_home = replica_table(pl, topology_preset("pcie-upi8"), 4096)
    assert by_home
    assert table[0, 0, 0] == 1 and table[0, 3, 0] == 1          # socket 0 -> device 1
    assert table[0, 6, 0] == 5 and table[0, 5, 0] == 5          # socket 1 -> device 5 (home)
    assert table[0, 1, 0] == 1
    # simulated: a token at home 6 selecting expert 0 is served on device 5, in its socket
    ex = np.zeros((4, 1, 1), np.int32)
    home = np.array([[6], [1], [0], [5]])
    r = simulate(ex, home, pl, topology_preset("pcie-upi8"), PIPELINES.get("attn-dp"), opts())
    assert r["total"]["lar_mean"] == pytest.approx(0.5)
    pairs = np.array(r["total"]["bytes_per_pair"])
    assert pairs[6, 5] > 0 and pairs[0, 1] > 0 and pairs[:, 4:][:4].sum() == 0
