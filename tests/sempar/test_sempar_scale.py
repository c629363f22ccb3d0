"""`sempar`'s large-trace path (placement/sempar/scale.py): the size rule, and that the path
completes and places well on a mid-size synthetic trace and on a planted instance (functional;
the speed targets are benchmarks/bench_placement_scale.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.placement import solve
from sempar.placement.sempar import scale as sempar_scale
from sempar.placement.base import crosses_groups
from sempar.schedule.evaluate import figures_for
from sempar.trace import split_by_request
from sempar.trace.synth import synthesize
from test_sempar_solver import G, planted, planted_placement


@pytest.fixture
def large_path(monkeypatch):
    """Every trace takes the large-trace path."""
    monkeypatch.setattr(sempar_scale, "SCALE_TOKEN_LAYERS", 0)


def test_size_rule():
    assert not sempar_scale.is_large(289_180, 6)               # tiny-moe64, whole dev trace
    assert not sempar_scale.is_large(20_000, 16)               # bench_placement's olmoe fit
    assert sempar_scale.is_large(1_000_000, 48)                # Qwen3-30B-A3B, 1M tokens
    assert sempar_scale.is_large(2_000_000, 58)                # DeepSeek-V3, 2M tokens


def test_default_path_below_the_rule():
    trace, _, _ = planted(T=20_000)
    assert solve("sempar", trace, num_devices=G).info["large_trace_path"] is False


def test_mid_size_synthetic(large_path):
    trace = synthesize("olmoe-1b-7b", 60_000, seed=1)
    fit, ev = split_by_request(trace, seed=0)
    p = solve("sempar", fit, num_devices=8, num_nodes=2)
    assert p.info["large_trace_path"] is True
    assert p.token_table.num_layers == trace.meta.num_layers
    got = figures_for(p, ev, "tp")
    van = figures_for(solve("vanilla", fit, num_devices=8, num_nodes=2), ev, "tp")
    print(f"\nlarge path, olmoe 60k EP 8 (2 nodes): LAR {got['lar_mean']:.3f} at imbalance "
          f"{got['imbalance_max_mean']:.3f}; vanilla {van['lar_mean']:.3f}")
    assert got["lar_mean"] > van["lar_mean"] + 0.05


def test_planted_recovered(large_path):
    trace, ecl, tcl = planted()
    fit, ev = split_by_request(trace, seed=0)
    ref = figures_for(planted_placement(trace, ecl, tcl), ev, "tp")["lar_mean"]
    a, b = solve("sempar", fit, num_devices=G, seed=2), solve("sempar", fit, num_devices=G, seed=2)
    assert np.array_equal(a.phy2log, b.phy2log)                             # deterministic
    got = figures_for(a, ev, "tp")["lar_mean"]
    print(f"\nlarge path, planted optimum LAR {ref:.3f}: got {got:.3f} ({got / ref:.1%})")
    assert got >= 0.9 * ref


def test_preserve_groups(large_path):
    trace, _, _ = planted(groups=2, T=20_000)
    p = solve("sempar", trace, num_devices=G, preserve_groups=True)
    assert p.info["large_trace_path"] and crosses_groups(p, 2) is None


def test_sparse_token_step_matches_dense():
    """The large path's token step (SparseLocal) against the dense `capacitated_assign` on
    the same instance: every token placed, capacities kept, the same best devices, and no
    less local activation than the dense rule with the same number of rounds."""
    from scipy import sparse

    from sempar.placement.sempar.load import onehot
    from sempar.placement.sempar.solver import capacitated_assign

    rng = np.random.default_rng(3)
    U, N, G8, k = 3000, 32, 8, 4
    a = rng.integers(1, 20, U).astype(np.float64)
    rows = np.repeat(np.arange(U), (a * k).astype(int))
    cols = rng.integers(0, N, rows.size) // 2 * 2 + (rng.random(rows.size) < 0.5)
    C = sparse.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(U, N))
    C.sum_duplicates()
    dev = rng.permutation(np.arange(N) % G8)
    cap = np.full(G8, a.sum() / G8)
    local = np.asarray(C @ onehot(dev, G8))
    sl = sempar_scale.SparseLocal(C, dev, G8)
    assert np.array_equal(sl.first(), np.argmax(local, axis=1))
    got = sl.assign(a, cap)
    assert got.min() >= 0 and got.max() < G8
    assert np.bincount(got, weights=a, minlength=G8).max() <= cap[0] + a.max()
    assert sl.total(got) == pytest.approx(local[np.arange(U), got].sum())
    ref = capacitated_assign(local, a, cap, sempar_scale.SCALE_TOKEN_ROUNDS)
    print(f"\nsparse token step {sl.total(got):.0f} local activations, dense "
          f"{local[np.arange(U), ref].sum():.0f}")
    assert sl.total(got) >= 0.999 * local[np.arange(U), ref].sum()


def test_planted_recovered_sparse_step(large_path, monkeypatch):
    """The sparse token step and the shorter expert search (taken above
    SCALE_SPARSE_DEVICES devices) still recover the planted optimum."""
    monkeypatch.setattr(sempar_scale, "SCALE_SPARSE_DEVICES", 0)
    trace, ecl, tcl = planted()
    fit, ev = split_by_request(trace, seed=0)
    ref = figures_for(planted_placement(trace, ecl, tcl), ev, "tp")["lar_mean"]
    got = figures_for(solve("sempar", fit, num_devices=G, seed=2), ev, "tp")["lar_mean"]
    print(f"\nsparse step, planted optimum LAR {ref:.3f}: got {got:.3f} ({got / ref:.1%})")
    assert got >= 0.9 * ref


@pytest.mark.parametrize("redundant, sparse_step", [(0, False), (0, True), (G, False)])
def test_worker_layers_identical_to_serial(large_path, monkeypatch, redundant, sparse_step):
    """Layers solved in forked workers (jobs 2) give the serial run's placement, replicas,
    token table and fit objectives, bit for bit."""
    from sempar.placement.sempar import _pool as layer_pool, solver as sempar_solver

    if sparse_step:
        monkeypatch.setattr(sempar_scale, "SCALE_SPARSE_DEVICES", 0)
    monkeypatch.setattr(sempar_solver, "BLOCK_LAYERS", 1)           # one layer per worker task
    jobs = []
    monkeypatch.setattr(sempar_solver, "map_layers", lambda fn, L, j, block: (
        jobs.append(j), layer_pool.map_layers(fn, L, j, block))[1])
    trace, _, _ = planted(T=20_000)
    a, b = (solve("sempar", trace, num_devices=G, redundant=redundant, seed=1, jobs=j)
            for j in (1, 2))
    assert jobs == [1, 2]
    assert np.array_equal(a.phy2log, b.phy2log)
    assert a.info["fit_local_activations"] == b.info["fit_local_activations"]
    ta, tb = a.token_table, b.token_table
    assert np.array_equal(ta.device, tb.device) and ta.device.dtype == tb.device.dtype
    assert np.array_equal(ta.confidence, tb.confidence)


def test_place_jobs_option(tmp_path):
    """`place --jobs`: a bad count exits 2 with one line and writes nothing; a good one places."""
    from conftest import run_cli
    from sempar.paths import assets_dir

    trace = assets_dir() / "traces" / "tiny-mixtral.parquet"
    out = tmp_path / "p.json"
    r = run_cli("place", "--trace", trace, "--method", "vanilla", "--ep", "4", "--jobs", "0",
                "--out", out)
    assert r.returncode == 2 and "--jobs" in r.stderr and not out.exists()
    r = run_cli("place", "--trace", trace, "--method", "vanilla", "--ep", "4", "--jobs", "2",
                "--out", out)
    assert r.returncode == 0 and out.exists(), r.stderr
