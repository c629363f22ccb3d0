"""LAR, remote copies, imbalance and the simple / oracle homes, on hand-made cases."""

from __future__ import annotations

import numpy as np

from sempar.placement import Placement
from sempar.placement.metrics import placement_figures, serving_device
from sempar.schedule.homes import home_dp_round_robin, home_tp_contiguous, oracle_home


def _p(nodes=None, phy=None):
    # 4 experts on 2 devices: device 0 = {0, 1}, device 1 = {2, 3}
    phy = np.array([[0, 1, 2, 3]]) if phy is None else phy
    return Placement(phy, 4, 2, node_of=nodes).validate()


def test_lar_and_remote_copies_by_hand():
    experts = np.array([[[0, 1]], [[0, 2]], [[2, 3]], [[3, 1]]])   # [T=4, L=1, k=2]
    home = np.array([[0], [0], [0], [1]])
    f = placement_figures(_p(), experts, home)
    # local activations: t0 2/2, t1 1/2, t2 0/2, t3 1/2 -> 4/8
    assert f["lar_mean"] == 0.5
    # remote devices per token: 0, 1, 1, 1
    assert f["remote_copies_per_token"] == 0.75
    # device loads: dev0 serves 0,1,0,1 = 4; dev1 serves 2,2,3,3 = 4
    assert f["load"].tolist() == [[4.0, 4.0]] and f["imbalance_max_mean"] == 1.0


def test_nearest_replica_is_used():
    # 4 experts, 2 devices with 3 slots: expert 0 replicated on both devices
    phy = np.array([[0, 1, 2, 0, 2, 3]])
    p = Placement(phy, 4, 2).validate()
    serve = serving_device(p, np.array([[[0]], [[0]]]), np.array([[0], [1]]))
    assert serve.ravel().tolist() == [0, 1]


def test_node_local_rate():
    phy = np.array([[0, 1, 2, 3]])
    p = Placement(phy, 4, 4, node_of=np.array([0, 0, 1, 1])).validate()
    f = placement_figures(p, np.array([[[1]], [[3]]]), np.array([[0], [0]]))
    assert f["lar_mean"] == 0.0 and f["node_local_rate"] == 0.5


def test_simple_homes():
    assert home_dp_round_robin(np.array([5, 5, 9, 2, 2, 7]), 2, 1).ravel().tolist() == \
        [0, 0, 1, 0, 0, 1]
    h = home_tp_contiguous(10, 2, 1, batch=4).ravel().tolist()
    assert h == [0, 0, 1, 1, 0, 0, 1, 1, 0, 1]


def test_oracle_respects_capacity():
    experts = np.array([[[0, 1]], [[0, 1]], [[0, 1]], [[2, 3]]])   # 3 tokens prefer device 0
    free = oracle_home(_p(), experts, batch=None).ravel().tolist()
    assert free == [0, 0, 0, 1]
    equal = oracle_home(_p(), experts, batch=4).ravel()
    assert np.bincount(equal, minlength=2).tolist() == [2, 2]
    f = placement_figures(_p(), experts, oracle_home(_p(), experts, batch=4))
    assert f["lar_mean"] == 0.75


def test_place_and_evaluate_cli(tmp_path):
    import json
    import subprocess
    import sys

    from sempar.trace import write_trace
    from sempar.trace.synth import synthesize

    write_trace(synthesize("olmoe-1b-7b", 8000, requests=40, seed=4), tmp_path / "t.parquet")
    run = lambda *a: subprocess.run([sys.executable, "-m", "sempar.cli", *a],  # noqa: E731
                                    capture_output=True, text=True, cwd=tmp_path)
    r = run("place", "--trace", "t.parquet", "--method", "eplb", "--ep", "4", "--redundant", "4",
            "--out", "p.json")
    assert r.returncode == 0, r.stderr
    assert Placement.load(tmp_path / "p.json").slots_per_device == 17
    # the fast methods: sempar's own dp solve is covered elsewhere and takes 80 s here
    r = run("evaluate", "--fit", "t.parquet", "--split", "--ep", "4", "--mode", "dp", "--json",
            "--methods", "vanilla,round-robin,eplb,exflow,smoe-cem")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert set(res["methods"]) >= {"vanilla", "round-robin", "eplb"}
    for m in res["methods"].values():
        assert 0.2 < m["lar_mean"] <= m["oracle_lar_mean"] + 1e-9 <= 1.0 + 1e-9
        assert m["imbalance_max_mean"] >= 1.0
    r = run("evaluate", "--fit", "t.parquet", "--ep", "4")
    assert r.returncode == 2 and "--split" in r.stderr


def test_semmoe_beats_vanilla_on_real_routing(moe64_split):
    """Sem-MoE Alg. 1 on the tiny-moe64 dev trace (fit 20%, held-out 80%), EP 4, tp mode."""
    from sempar.placement import solve
    from sempar.schedule.homes import home_tp_contiguous, home_tp_table

    fit, ev = moe64_split
    sem = solve("semmoe", fit, num_devices=4)
    van = solve("vanilla", fit, num_devices=4)
    L = ev.meta.num_layers
    f_sem = placement_figures(sem, ev.experts, home_tp_table(ev.token_id, sem.token_table, 4))
    f_van = placement_figures(van, ev.experts, home_tp_contiguous(ev.num_tokens, 4, L))
    assert abs(f_van["lar_mean"] - 0.25) < 0.01          # 1/G: routing ignores the position split
    assert f_sem["lar_mean"] > 1.3 * f_van["lar_mean"]   # measured 0.359 vs 0.250
    assert f_sem["imbalance_max_mean"] <= 1.10
    assert set(np.unique(sem.phy2log[0])) == set(range(64))
