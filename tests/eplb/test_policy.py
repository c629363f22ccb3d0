"""The engine-free policy core (`sempar.eplb.policy`) and FILE loader (`sempar.eplb.source`) on
FILEs made from the shipped tiny-moe64 trace; no engine needed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from eplb_cases import G, R, broken_files
from sempar.eplb.config import PluginConfig
from sempar.eplb.engine import check_map
from sempar.eplb.policy import _hosts, _imbalance, _locality, map_loads, rebalance_report
from sempar.eplb.source import SourceMismatch, load_source
from sempar.placement.eplb import rebalance_experts as eplb_default
from eplb_fixtures import files, tiny_trace  # noqa: F401  (fixtures)


def _src(path, L=6, N=64, ranks=G, **kw):
    return load_source(str(path), num_layers=L, num_experts=N, num_ranks=ranks, **kw)


def _figures(m, w, A):
    N = w.shape[1]
    hosts = [_hosts(m[l], G, N) for l in range(w.shape[0])]
    return (np.mean([_imbalance(map_loads(m[l], w[l], G)) for l in range(w.shape[0])]),
            np.mean([_locality(h, A[l], float(A[l].sum())) for l, h in enumerate(hosts)]))


@pytest.mark.parametrize("kind", ["stats", "placement"])
@pytest.mark.parametrize("redundant", [0, R])
def test_map_is_valid_local_and_balanced(files, kind, redundant):
    """A valid map that keeps more of the stats' co-activation on one device than DeepSeek EPLB
    (sempar's port, what both engines run), at a balance near EPLB's."""
    w = files["window"]
    L, N = w.shape
    P = N + redundant
    src = _src(files[kind])
    # the live window alone: on this stationary synthetic trace every split of FILE's rows is
    # a few requests of one topic, and the robust default gives the co-location up for them
    m, rep = rebalance_report(w, P, 1, 1, G, None, src, PluginConfig(scenarios=1))
    assert check_map(m, L, P, N, G, distinct=True) is None
    truth = _src(files["stats"]).affinity                   # locality judged on the stats
    imb, loc = _figures(m, w, truth)
    e_imb, e_loc = _figures(eplb_default(w, P, 1, 1, G)[0], w, truth)
    assert loc > 1.3 * e_loc, (loc, e_loc)
    assert imb <= max(e_imb, PluginConfig().max_imbalance) + 0.05, (imb, e_imb)
    if kind == "stats":
        assert rep.lar_after is not None and 0 < rep.lar_after <= 1


@pytest.mark.parametrize("redundant", [0, R])
def test_robust_layout_holds_on_every_split(files, redundant):
    """With scenarios, the map's worst imbalance over the splits of FILE's rows (the mixes the
    traffic had) is lower than the live-window-only map's, and the live window stays within
    reach of its bound; scenarios=1 is the live window alone (no sample needed)."""
    from sempar.eplb.scenarios import scenario_loads

    w = files["window"]
    L, N = w.shape
    P = N + redundant
    src = _src(files["stats"], sample_rows=4096)
    K = PluginConfig().scenario_count()
    W = scenario_loads(w, src.sample, K)
    assert W.shape == (L, K, N) and np.allclose(W[:, 0], w)
    assert np.allclose(W.sum(axis=2), w.sum(axis=1)[:, None])
    assert scenario_loads(w, src.sample, 1).shape == (L, 1, N)

    def worst(m):
        return np.mean([map_loads(m[l], W[l, 1:], G).max(axis=1).max()
                        / map_loads(m[l], W[l, 1:], G).mean() for l in range(L)])

    single = rebalance_report(w, P, 1, 1, G, None, src, PluginConfig(scenarios=1))[0]
    robust, rep = rebalance_report(w, P, 1, 1, G, None, src)
    assert check_map(robust, L, P, N, G, distinct=True) is None
    assert worst(robust) < worst(single) - 0.02, (worst(robust), worst(single))
    live = np.mean([_imbalance(map_loads(robust[l], w[l], G)) for l in range(L)])
    assert live <= PluginConfig().max_imbalance + 0.10, live
    assert rep.imbalance_after == pytest.approx(live)


def test_budget_and_stability(files):
    w = files["window"]
    L, N = w.shape
    P = N + R
    src = _src(files["stats"])
    start = eplb_default(w, P, 1, 1, G)[0]                  # the engine's own map is serving
    free = rebalance_report(w, P, 1, 1, G, start, src)[1]
    assert free.moves > 40
    m, rep = rebalance_report(w, P, 1, 1, G, start, src, PluginConfig(max_moves=40))
    assert 0 < rep.moves <= 40 and check_map(m, L, P, N, G, distinct=True) is None
    assert int((m != start).sum()) == rep.moves
    byte = rebalance_report(w, P, 1, 1, G, start, src,
                            PluginConfig(max_bytes=30e6, expert_bytes=1e6))[1]
    assert byte.moves <= 30
    again, rep2 = rebalance_report(w, P, 1, 1, G, m, src)
    m3, rep3 = rebalance_report(w, P, 1, 1, G, again, src)
    assert rep3.moves == 0 and np.array_equal(m3, again)  # a settled map stays put


def test_slots_kept_for_experts_that_stay(files):
    """An expert that stays on its rank keeps its slot: relabelled devices, then slots kept."""
    w = files["window"]
    N = w.shape[1]
    src = _src(files["stats"])
    m = rebalance_report(w, N + R, 1, 1, G, None, src)[0]
    perm = np.concatenate([np.roll(np.arange(G), 1)[g] * (N + R) // G
                           + np.arange((N + R) // G) for g in range(G)])
    shuffled = m[:, perm]                                  # same groups on other ranks
    m2, rep = rebalance_report(w, N + R, 1, 1, G, shuffled, src)
    assert rep.moves == 0 and np.array_equal(m2, shuffled)


def test_every_broken_file_is_one_line(files, tmp_path):
    for name, (path, env) in broken_files(files, tmp_path).items():
        if name in ("bad-knob",):
            continue
        with pytest.raises(SourceMismatch) as err:
            _src(path, model=env.get("SEMPAR_EPLB_MODEL"),
                 max_age_s=float(env["SEMPAR_EPLB_MAX_AGE_S"]) if "SEMPAR_EPLB_MAX_AGE_S" in env
                 else None)
        assert "\n" not in str(err.value) and str(err.value), name


def test_refresh_is_read_once_settled(files, tmp_path):
    """A refreshed FILE (atomic rename) is used at the next rebalance once `settle_s` old;
    the previous version serves until then."""
    from sempar.atomic import atomic_path

    f = tmp_path / "live.stats"
    f.write_bytes(files["stats"].read_bytes())
    a = _src(f)
    os.utime(f, (1e9, 1e9))
    with atomic_path(f, option="SEMPAR_EPLB") as tmp:
        tmp.write_bytes(files["stats"].read_bytes())
    assert _src(f, settle_s=3600) is a                     # too fresh: the old version
    assert _src(f, settle_s=0) is not a


def test_importing_sempar_imports_no_engine():
    code = ("import sys, sempar, sempar.eplb.policy, sempar.eplb.engine, "
            "sempar.eplb.vllm_plugin, sempar.eplb.sglang_plugin\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'sglang', 'torch')]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_config_from_env():
    cfg = PluginConfig.from_env({"SEMPAR_EPLB_MAX_MOVES": "12", "SEMPAR_EPLB_MAX_IMBALANCE": "1.2"})
    assert cfg.max_moves == 12 and cfg.max_imbalance == 1.2 and cfg.move_budget() == 12
    from sempar.errors import InputError
    with pytest.raises(InputError):
        PluginConfig.from_env({"SEMPAR_EPLB_MAX_MOVES": "many"})


def test_plan_keeps_engine_maps_with_two_copies_on_a_rank(files, monkeypatch):
    """vLLM's own policy may put two copies of an expert on one rank; a layer sempar leaves as
    it is (budget spent) keeps them, and the map is still sempar's, not a fallback."""
    import logging

    from sempar.eplb import engine

    w = files["window"]
    L, N = w.shape
    P = N + R
    old = eplb_default(w, P, 1, 1, G)[0]
    S = P // G
    cnt = np.bincount(old[0], minlength=N)
    spare = [p for p in range(S, P) if cnt[old[0, p]] > 1]   # a copy that can go
    assert spare
    old[0, spare[0]] = old[0, spare[0] // S * S + (spare[0] % S == 0)]   # a rank-mate's twin
    assert (np.bincount(old[0], minlength=N) > 0).all()
    rank = old[0].reshape(G, S)[spare[0] // S]
    assert np.unique(rank).size < S                         # two copies on one rank
    monkeypatch.setenv("SEMPAR_EPLB", str(files["stats"]))
    monkeypatch.setenv("SEMPAR_EPLB_MAX_MOVES", "0")
    m = engine.plan(w, P, 1, 1, G, old, logging.getLogger("test"))
    assert m is not None and np.array_equal(m, old)
    assert engine.LAST["fallback_reason"] is None


def test_placement_with_more_replicas_than_the_engine(files, tmp_path):
    """A placement solved with 8 redundant slots (18 distinct experts on device 0) serves an
    engine with none: the extra primaries move, the map is valid."""
    from sempar.placement.placement import Placement

    w = files["window"]
    L, N = w.shape
    rows = []
    for l in range(L):
        rest = np.arange(18, N)
        others = np.concatenate([rest, rest[:8]]).reshape(3, 18)     # 46 experts + 8 replicas
        rows.append(np.concatenate([np.arange(18), others.ravel()]))
    f = tmp_path / "r8.json"
    Placement(np.stack(rows), N, G, info={"model": files["model"]}).save(f)
    m, rep = rebalance_report(w, N, 1, 1, G, None, _src(f))
    assert check_map(m, L, N, N, G, distinct=True) is None
    assert rep.locality_after > 0.5                          # most of the groups kept


def test_profile_run_and_hierarchy_arguments(files):
    """vLLM's profile run hands an all-zero window: a valid map, no error; the hierarchy
    arguments (expert groups, nodes) do not change sempar's map."""
    w = files["window"]
    L, N = w.shape
    src = _src(files["stats"])
    zero, _ = rebalance_report(np.zeros_like(w), N + R, 1, 1, G, None, src)
    assert check_map(zero, L, N + R, N, G, distinct=True) is None
    flat = rebalance_report(w, N + R, 1, 1, G, None, src)[0]
    assert np.array_equal(flat, rebalance_report(w, N + R, 8, 2, G, None, src)[0])


def test_small_budget_still_balances(files):
    """A budget too small for any whole layer: the layers above the bound get balance swaps
    only, within the budget."""
    w = files["window"]
    N = w.shape[1]
    src = _src(files["stats"])
    m = rebalance_report(w, N + R, 1, 1, G, None, src)[0]
    skew = w * np.random.default_rng(0).uniform(0.3, 1.7, w.shape)    # the load drifted
    full = rebalance_report(skew, N + R, 1, 1, G, m, src)[1]
    assert full.imbalance_before > PluginConfig().max_imbalance + 0.01
    assert max(full.per_layer_moves) > 6
    m2, rep = rebalance_report(skew, N + R, 1, 1, G, m, src, PluginConfig(max_moves=6))
    assert 0 < rep.moves <= 6 and int((m2 != m).sum()) == rep.moves
    assert rep.imbalance_after < rep.imbalance_before


def test_swap_rule_options(files):
    """`swap_rule` / `swap_min_cut` (`swaps.py`) parse from the environment, bad values are one
    line, and each rule gives a valid map whose live window is balanced near the bound; a
    looser cut share (0.2) keeps at least the locality of the balance-first default."""
    from sempar.errors import InputError

    cfg = PluginConfig.from_env({"SEMPAR_EPLB_SWAP_RULE": "per-cut",
                                 "SEMPAR_EPLB_SWAP_MIN_CUT": "0.25"})
    assert cfg.swap_rule == "per-cut" and cfg.swap_min_cut == 0.25
    for bad in ({"SEMPAR_EPLB_SWAP_RULE": "random"}, {"SEMPAR_EPLB_SWAP_MIN_CUT": "0"},
                {"SEMPAR_EPLB_SWAP_MIN_CUT": "x"}):
        with pytest.raises(InputError):
            PluginConfig.from_env(bad)
    w = files["window"]
    L, N = w.shape
    P = N + R
    src = _src(files["stats"])
    truth = src.affinity
    figs = {}
    for rule, cut in (("balance-first", 0.5), ("per-cut", 0.5), ("balance-first", 0.2)):
        m, _ = rebalance_report(w, P, 1, 1, G, None, src,
                                PluginConfig(scenarios=1, swap_rule=rule, swap_min_cut=cut))
        assert check_map(m, L, P, N, G, distinct=True) is None
        figs[rule, cut] = _figures(m, w, truth)
        assert figs[rule, cut][0] <= PluginConfig().max_imbalance + 0.05, (rule, figs)
    assert figs["balance-first", 0.2][1] >= figs["balance-first", 0.5][1] - 0.01, figs


def test_scenarios_by_engine():
    """SCENARIOS unset: 17 load vectors under vLLM (a map serves several windows), 5 under
    SGLang and elsewhere; set, it wins in every engine; `engine` is not read from the env."""
    assert PluginConfig.from_env({}, engine="vllm").scenario_count() == 17
    assert PluginConfig.from_env({}, engine="sglang").scenario_count() == 5
    assert PluginConfig().scenario_count() == 5
    cfg = PluginConfig.from_env({"SEMPAR_EPLB_SCENARIOS": "3", "SEMPAR_EPLB_ENGINE": "x"},
                                engine="vllm")
    assert cfg.scenario_count() == 3 and cfg.engine == "vllm"
    assert PluginConfig(scenarios=1, engine="vllm").sample_rows() == PluginConfig(
        scenarios=1).sample_rows()


def test_finish_live_balances_the_window_a_split_peak_left_above_its_bound():
    """`swaps.balance_swaps`: a split whose peak no swap can cut (one expert alone above the
    bound) stops the robust loop; the live finish still brings the live window within its
    bound without lifting any scenario above the worst peak left, and stops at a fixpoint."""
    from sempar.eplb.swaps import balance_swaps

    G, S = 4, 4
    N = G * S
    rng = np.random.default_rng(3)
    live = rng.uniform(1.0, 2.0, N)
    live[:S] *= 3.0                                    # device 0's experts: the live peak
    split = np.full(N, live.sum() / N)
    split[5] = 0.5 * live.sum()                        # one expert no swap can help
    share = np.stack([live, split * live.sum() / split.sum()])
    caps = np.array([1.05, 1.10])

    def run(finish: bool):
        hosts = np.zeros((G, N), bool)
        hosts[np.repeat(np.arange(G), S), np.arange(N)] = True
        ee = np.nonzero(hosts)[1].astype(np.int64)
        load = share @ hosts.T.astype(np.float64)
        A = np.zeros((N, N), np.float32)
        aff = (hosts.astype(np.float32) @ A).astype(np.float64)
        worst0 = float((load / caps[:, None]).max())
        made = balance_swaps(load, hosts, ee, share.copy(), aff, A, S, caps, 64,
                             finish_live=finish)
        assert np.allclose(load, share @ hosts.T.astype(np.float64))
        assert (hosts.sum(axis=1) == S).all() and (hosts.sum(axis=0) == 1).all()
        return made, load, worst0, hosts, ee, aff, A

    made_off, load_off, _, _, _, _, _ = run(False)
    made_on, load_on, worst0, hosts, ee, aff, A = run(True)
    live_imb = lambda ld: ld[0].max() / ld[0].mean()
    assert live_imb(load_off) > 1.05                   # the robust loop stopped above the bound
    assert live_imb(load_on) <= 1.05 + 1e-9
    assert (load_on / caps[:, None]).max() <= worst0 + 1e-9
    assert balance_swaps(load_on, hosts, ee, share.copy(), aff, A, S, caps, 64,
                         finish_live=True) == 0


def test_replica_rule_by_engine_and_home_copies(files):
    """REPLICA_RULE unset: `load` in both engines (`home` / `cold` opt-in: at DeepSeek-V3 shape
    they balanced less well); set, it wins; a bad value is one line. The home rule fills each device's
    free slot with the expert its experts co-activate with most, gives a valid map, and keeps
    at least the load rule's co-location."""
    from sempar.errors import InputError
    from sempar.eplb.policy import _home_replicas

    assert PluginConfig.from_env({}, engine="vllm").replica_rule_of() == "load"
    assert PluginConfig.from_env({}, engine="sglang").replica_rule_of() == "load"
    assert PluginConfig.from_env({"SEMPAR_EPLB_REPLICA_RULE": "home"},
                                 engine="sglang").replica_rule_of() == "home"
    assert PluginConfig().replica_rule_of() == "load"
    with pytest.raises(InputError):
        PluginConfig.from_env({"SEMPAR_EPLB_REPLICA_RULE": "random"})
    # 4 experts on 2 devices, 3 slots each: device 0 holds {0, 1} and co-activates with 2
    A = np.zeros((4, 4), np.float32)
    A[0, 2] = A[2, 0] = 5.0
    A[1, 3] = A[3, 1] = 1.0
    A[2, 3] = A[3, 2] = 0.5
    hosts = np.array([[1, 1, 0, 0], [0, 0, 1, 1]], bool)
    aff = hosts.astype(np.float32) @ A
    cnt = _home_replicas(hosts, aff, A, 3)
    assert hosts[0, 2] and hosts[1, 0] and list(cnt) == [2, 1, 2, 1]
    # an expert hotter than a device's bound still gets its copies by load
    from sempar.eplb.policy import _needed_copies

    W = np.array([[6.0, 1.0, 1.0, 0.0], [2.0, 2.0, 2.0, 2.0]])         # device mean 4 on 2
    assert list(_needed_copies(W, np.array([1.0, 1.1]), 2)) == [2, 1, 1, 1]
    w = files["window"]
    L, N = w.shape
    P = N + R
    src = _src(files["stats"])
    figs = {}
    for rule in ("load", "home", "cold"):
        m, _ = rebalance_report(w, P, 1, 1, G, None, src,
                                PluginConfig(scenarios=1, replica_rule=rule))
        assert check_map(m, L, P, N, G, distinct=True) is None
        figs[rule] = _figures(m, w, src.affinity)
        assert figs[rule][0] <= PluginConfig().max_imbalance + 0.05, figs
    assert figs["home"][1] >= figs["load"][1] - 0.01, figs
