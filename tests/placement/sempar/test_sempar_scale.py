"""`sempar`'s large-trace path (placement/sempar/scale.py): the size rule, and that the path
completes and places well on a mid-size synthetic trace and on a planted instance (functional;
the speed targets are benchmarks/bench_placement_scale.py's). The path is forced by a config
(`SemparConfig(large_trace=True)`), not by the trace's size."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.placement import solve
from sempar.placement.sempar import SemparConfig, sempar_solve, scale as sempar_scale
from sempar.placement.base import PlacementProblem, crosses_groups
from sempar.schedule.evaluate import figures_for
from sempar.trace import split_by_request
from sempar.trace.synth import synthesize
from test_sempar_solver import G, planted, planted_placement


LARGE = SemparConfig(large_trace=True)                          # any trace: the large path
SPARSE = SemparConfig(large_trace=True, sparse_step=True)       # ... with the sparse token step


def large(trace, G: int, config: SemparConfig = LARGE, **problem):
    """`solve("sempar", trace, num_devices=G, **problem)` under `config`."""
    return sempar_solve(PlacementProblem(trace, G, **problem), config)


def test_size_rule():
    def rule(tokens: int, layers: int, experts: int, devices: int) -> tuple[bool, bool, bool]:
        c = SemparConfig.for_shape(tokens, layers, experts, devices)
        return c.large_trace, c.sparse_step, c.bounded_experts
    assert rule(289_180, 6, 64, 4) == (False, False, False)     # tiny-moe64, whole dev trace
    assert rule(20_000, 16, 64, 8) == (False, False, False)     # bench_placement's olmoe fit
    assert rule(1_000_000, 48, 128, 8) == (True, False, True)   # Qwen3-30B-A3B, 1M tokens
    assert rule(2_000_000, 58, 256, 64) == (True, True, True)   # DeepSeek-V3, 2M tokens, EP 64
    # a setting given is kept; the others are still decided
    assert SemparConfig.for_shape(10, 1, 8, 4, large_trace=True).large_trace
    assert SemparConfig.for_shape(10, 1, 8, 4, scale_token_layers=9).large_trace
    assert SemparConfig.for_shape(10, 1, 8, 4, large_trace=True).sparse_step is False


def test_default_path_below_the_rule():
    trace, _, _ = planted(T=20_000)
    assert solve("sempar", trace, num_devices=G).info["large_trace_path"] is False


def test_mid_size_synthetic():
    trace = synthesize("olmoe-1b-7b", 60_000, seed=1)
    fit, ev = split_by_request(trace, seed=0)
    p = large(fit, 8, num_nodes=2)
    assert p.info["large_trace_path"] is True
    assert p.token_table.num_layers == trace.meta.num_layers
    got = figures_for(p, ev, "tp")
    van = figures_for(solve("vanilla", fit, num_devices=8, num_nodes=2), ev, "tp")
    print(f"\nlarge path, olmoe 60k EP 8 (2 nodes): LAR {got['lar_mean']:.3f} at imbalance "
          f"{got['imbalance_max_mean']:.3f}; vanilla {van['lar_mean']:.3f}")
    assert got["lar_mean"] > van["lar_mean"] + 0.05


def test_planted_recovered():
    trace, ecl, tcl = planted()
    fit, ev = split_by_request(trace, seed=0)
    ref = figures_for(planted_placement(trace, ecl, tcl), ev, "tp")["lar_mean"]
    a, b = large(fit, G, seed=2), large(fit, G, seed=2)
    assert np.array_equal(a.phy2log, b.phy2log)                             # deterministic
    got = figures_for(a, ev, "tp")["lar_mean"]
    print(f"\nlarge path, planted optimum LAR {ref:.3f}: got {got:.3f} ({got / ref:.1%})")
    assert got >= 0.9 * ref


def test_preserve_groups():
    trace, _, _ = planted(groups=2, T=20_000)
    p = large(trace, G, preserve_groups=True)
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
    rounds = SemparConfig().scale_token_rounds
    got = sl.assign(a, cap, rounds)
    assert got.min() >= 0 and got.max() < G8
    assert np.bincount(got, weights=a, minlength=G8).max() <= cap[0] + a.max()
    assert sl.total(got) == pytest.approx(local[np.arange(U), got].sum())
    ref = capacitated_assign(local, a, cap, rounds)
    print(f"\nsparse token step {sl.total(got):.0f} local activations, dense "
          f"{local[np.arange(U), ref].sum():.0f}")
    assert sl.total(got) >= 0.999 * local[np.arange(U), ref].sum()


def test_planted_recovered_sparse_step():
    """The sparse token step and the shorter expert search (taken above
    `scale_sparse_devices` devices) still recover the planted optimum."""
    trace, ecl, tcl = planted()
    fit, ev = split_by_request(trace, seed=0)
    ref = figures_for(planted_placement(trace, ecl, tcl), ev, "tp")["lar_mean"]
    got = figures_for(large(fit, G, SPARSE, seed=2), ev, "tp")["lar_mean"]
    print(f"\nsparse step, planted optimum LAR {ref:.3f}: got {got:.3f} ({got / ref:.1%})")
    assert got >= 0.9 * ref


@pytest.mark.parametrize("redundant, sparse_step", [(0, False), (0, True), (G, False)])
def test_worker_layers_identical_to_serial(redundant, sparse_step):
    """Layers solved in forked workers (jobs 2) give the serial run's placement, replicas,
    token table and fit objectives, bit for bit."""
    from sempar.placement.sempar._pool import map_layers

    cfg = SemparConfig(large_trace=True, sparse_step=sparse_step,
                       block_layers=1)                          # one layer per worker task
    jobs = []

    def mapper(fn, L, j, block):                                # the pool, asked for j workers
        jobs.append(j)
        return map_layers(fn, L, j, block)
    trace, _, _ = planted(T=20_000)
    a, b = (sempar_solve(PlacementProblem(trace, G, redundant=redundant, seed=1, jobs=j), cfg,
                         mapper=mapper) for j in (1, 2))
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
