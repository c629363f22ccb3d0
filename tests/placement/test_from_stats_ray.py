"""`place --stats --ray`: the per-layer solves as Ray tasks on a local cluster (2 CPUs) give
the placement of the local path, bit for bit; --ray without --stats is one line."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import build_trace, run_cli
from sempar.trace.io import write_trace


def test_ray_layer_solves_equal_the_local_ones(tmp_path):
    pytest.importorskip("ray")
    from sempar.stats.run import StatsSettings, build_stats
    from sempar.placement.from_stats import solve_from_stats
    from sempar.placement.sempar.ray_layers import RayLayers
    from sempar.ray_cluster import ray_session
    from sempar.solve_options import SolveOptions

    trace = build_trace(T=600, R=60, L=3, N=8, k=2, seed=5)
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    stats = build_stats([str(path)], StatsSettings())
    options = SolveOptions(objective="rows", jobs=1)
    local = solve_from_stats(stats, num_devices=4, options=options)
    with ray_session("local", 2) as ray:
        mapper = RayLayers(ray)
        remote = solve_from_stats(stats, num_devices=4, options=options, mapper=mapper)
    assert mapper.tasks >= 3                      # the three layers went to Ray tasks
    assert np.array_equal(local.phy2log, remote.phy2log)
    assert np.array_equal(local.token_table.device, remote.token_table.device)
    # the held-out prediction's fold solves run in Ray workers (one BLAS thread each): its
    # floats may differ in the last digits from the local solve's, the placement may not
    held_l, held_r = local.info.pop("held_out"), remote.info.pop("held_out")
    assert local.info == remote.info
    assert held_l["fit_cap"] == held_r["fit_cap"]
    for key in ("predicted_imbalance", "bootstrap_imbalance", "predicted_upper"):
        assert held_l[key] == pytest.approx(held_r[key], abs=0.01)


def test_ray_needs_stats(tmp_path):
    p = tmp_path / "t.parquet"
    write_trace(build_trace(T=120, R=12), p)
    r = run_cli("place", "--trace", p, "--ep", "4", "--ray", "local", "--out", tmp_path / "p.json")
    assert r.returncode == 2 and "--ray" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()
