"""Testbed, launcher, profiler and fidelity: pure parts everywhere, loopback ranks everywhere
(gloo on 127.0.0.1 needs no privileges), namespaces only where root + ip + tc + netns work."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from sempar.comm.topology import PHASES, Topology
from sempar.comm.topology_presets import topology_preset
from sempar.errors import InputError
from sempar.testbed import fidelity as F
from sempar.testbed import profiler, shaping
from sempar.testbed.launch import LaunchError, launch


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from sempar.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout)


# ---- pure --------------------------------------------------------------------------------
def test_resolve_preset_spreads_hosts_over_nodes():
    t = shaping.resolve_preset("pcie-upi8", 4)
    assert t.name == "pcie-upi8[0,1,4,5]"
    assert t.node_of.tolist() == [0, 0, 1, 1]
    rates = shaping.shaped_rates(t, 1 / 8000)
    # 64 GB/s inside a socket -> 8 MB/s; 20 GB/s over UPI -> 2.5 MB/s
    assert rates[0, 1] == pytest.approx(8e6) and rates[2, 3] == pytest.approx(8e6)
    assert rates[0, 2] == pytest.approx(2.5e6) and rates[3, 1] == pytest.approx(2.5e6)
    assert np.all(np.diag(rates) == 0)
    ib = shaping.resolve_preset("a100x4-ib", 12)          # grows to 3 nodes
    assert ib.num_devices == 12 and ib.num_nodes == 3
    ib4 = shaping.resolve_preset("a100x4-ib", 4)
    assert ib4.node_of.tolist() == [0, 0, 1, 1]


def test_resolve_preset_from_file(tmp_path):
    topology_preset("pcie-upi8").save(tmp_path / "t.json")
    assert shaping.resolve_preset(str(tmp_path / "t.json"), 8).num_devices == 8


@pytest.mark.parametrize("preset,hosts,scale", [("pcie-upi8", 1, 1e-3), ("pcie-upi8", 9, 1e-3),
                                                ("nope", 4, 1e-3), ("pcie-upi8", 4, 0.0),
                                                ("pcie-upi8", 4, 1e-12)])
def test_bad_testbed_input(preset, hosts, scale):
    with pytest.raises(InputError):
        shaping.shaped_rates(shaping.resolve_preset(preset, hosts), scale)


def test_tc_script_one_class_and_filter_per_destination():
    rates = np.array([0.0, 8e6, 2.5e6])
    s = shaping.tc_script(rates, 0)
    assert "htb default 1" in s
    assert "classid 1:b htb rate 64000000bit ceil 64000000bit" in s
    assert "classid 1:c htb rate 20000000bit ceil 20000000bit" in s
    assert "match ip dst 10.77.0.2/32 flowid 1:b" in s
    assert "match ip dst 10.77.0.3/32 flowid 1:c" in s
    assert "10.77.0.1/32" not in s                    # no class towards itself


def test_fit_alpha_beta_recovers_line_and_handles_burst():
    m = np.array([4096, 65536, 262144, 786432], float)
    assert profiler.fit_alpha_beta(m, 2e-4 + m / 2.5e6) == pytest.approx((2e-4, 1 / 2.5e6))
    # htb burst: the small size goes through at line rate -> negative intercept -> floor alpha
    t = m / 2.5e6
    t[0] = 1e-4
    a, b = profiler.fit_alpha_beta(m, t, floor_alpha=5e-5)
    assert a == 5e-5 and 1 / b == pytest.approx(2.5e6, rel=0.02)


def test_assemble_refines_bottleneck_edges():
    G, sizes = 3, [65536, 262144, 786432]
    bw = np.array([[0, 8e6, 2e6], [8e6, 0, 2e6], [2e6, 2e6, 0]])
    p1 = [[u, v, m, 1e-4 + m / bw[u, v]] for u in range(G) for v in range(G) if u != v
          for m in sizes]
    # under contention rank 0's one-to-many takes 1.5x its predicted bottleneck 0 -> 2
    p2 = [["d", 0, m, 1.5 * (1e-4 + m / 2e6)] for m in sizes]
    p2 += [["c", 1, m, 1e-4 + m / 2e6] for m in sizes]
    p2 += [["d", 1, 65536, 1.0]]             # one size only (0.1 s): cannot refit, baseline kept
    raw = {"world": G, "sizes": sizes, "reps": 1, "seconds": 1.0, "p1": p1, "p2": p2,
           "rtt1": [[u, v, 2e-4] for u in range(G) for v in range(G) if u != v]}
    topo, summ = profiler.assemble(raw, node_of=[0, 0, 1])
    bwm = profiler.bandwidth_matrix(topo, "metadata")
    assert bwm[0, 1] == pytest.approx(8e6) and bwm[2, 0] == pytest.approx(2e6)
    d = profiler.bandwidth_matrix(topo, "dispatch")
    assert d[0, 2] == pytest.approx(2e6 / 1.5, rel=1e-6)     # refined edge
    assert d[0, 1] == pytest.approx(8e6)                     # not the bottleneck: baseline
    assert d[1, 2] == pytest.approx(2e6)                     # single-size sample: baseline
    c = profiler.bandwidth_matrix(topo, "combine")
    assert c[2, 1] == pytest.approx(2e6)                     # combine bottleneck into 1 is 2 -> 1
    assert {(e["phase"], e["src"], e["dst"]) for e in summ["refined_edges"]} == {
        ("dispatch", 0, 2), ("combine", 2, 1)}
    assert topo.node_of.tolist() == [0, 0, 1]


def test_fidelity_cases_and_report(tmp_path):
    cases = F.fidelity_cases(4, sizes=(65536, 262144))
    assert [c["kind"] for c in cases] == ["uniform", "skewed", "hot"] * 2
    for c in cases:
        b = np.asarray(c["bytes"])
        assert b.shape == (4, 4) and np.all(np.diag(b) == 0) and b[~np.eye(4, dtype=bool)].min() > 0
        assert b[~np.eye(4, dtype=bool)].mean() >= c["size"] * 0.99 or c["kind"] == "hot"
    G = 4
    beta = np.full((G, G), 1 / 2e6)
    topo = Topology("t", np.zeros(G, int), np.zeros((G, G)), beta)
    exact = [float(np.asarray(c["bytes"]).max() / 2e6) for c in cases]
    measured = [t * k for t, k in zip(exact, [1.0, 1.1, 1.2, 1.0, 0.9, 1.0])]
    rep = F.fidelity_report(topo, cases, measured)
    assert rep["num_cases"] == 6
    assert rep["cases"][1]["rel_error"] == pytest.approx(0.1 / 1.1)
    assert rep["median_abs_error"] == pytest.approx(np.median(
        [0, 0.1 / 1.1, 0.2 / 1.2, 0, 0.1 / 0.9, 0]))
    png = F.plot_fidelity(rep, tmp_path / "f.png")
    assert png.stat().st_size > 1000


def test_profile_cli_bad_input_exit_2(tmp_path):
    for args in (["--hosts", "1"], ["--hosts", "3", "--sizes", "5"],
                 ["--hosts", "3", "--sizes", "a,b"], ["--hosts", "3", "--method", "ring"],
                 ["--hosts", "3", "--testbed", "nope"], ["--hosts", "3", "--reps", "0"]):
        r = _cli("profile", *args, "--out", str(tmp_path / "t.json"))
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert not (tmp_path / "t.json").exists()


# ---- loopback ranks (no privileges) --------------------------------------------------------
def test_profile_loopback_writes_topology(tmp_path):
    out = tmp_path / "topo.json"
    r = _cli("profile", "--hosts", "2", "--out", str(out), "--sizes", "4096,65536",
             "--reps", "1", "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["topology"] == str(out) and d["latency_shaped"] is False
    assert set(d["fidelity"]) >= {"median_abs_error", "cases", "num_cases"}
    assert d["fidelity"]["num_cases"] == len(d["fidelity"]["cases"]) == 9
    t = Topology.load(out)
    assert t.num_devices == 2 and t.alpha.shape == (len(PHASES), 2, 2)
    assert (t.beta[:, 0, 1] > 0).all() and (t.beta[:, 1, 0] > 0).all()


@pytest.mark.parametrize("mode", ["die", "hang"])
def test_failed_rank_makes_every_rank_exit(mode):
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as e:
        launch("sempar.testbed.profiler:profile_rank", 3, {"sizes": [1024, 2048], "reps": 1},
               timeout_s=60, op_timeout_s=4, grace_s=8, fault=f"1:{mode}")
    took = time.monotonic() - t0
    msg = str(e.value)
    assert "rank 1 failed first" in msg or ("rank 0 failed first" in msg and mode == "hang") \
        or "rank 2 failed first" in msg
    if mode == "die":
        assert "rank 1 failed first (exit code 17): rank 1: injected fault: die" in msg
    else:       # the hung rank is stopped: the others time out, then it is killed
        assert "lost or timed out waiting for a peer" in msg and "killed ranks" in msg
    assert took < 45


def test_run_time_limit_kills_ranks():
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="exceeded its 3 s limit"):
        launch("sempar.testbed.profiler:profile_rank", 2, {"sizes": [1024, 2048]},
               timeout_s=3, op_timeout_s=60, fault="1:hang")
    assert time.monotonic() - t0 < 15
