"""`sempar replay` with the engines' own balancers, replica slots and dispatch (issues 43 / 45),
and the drift options passed whole (issue 44): the engine policies call the engines' installed
code (skipped with the reason where an engine is not installed), at their cadences."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli
from sempar.drift import engines
from sempar.drift.config import ReplayConfig, rebalance_config
from sempar.drift.costs import MOVES_MAX, expert_bytes
from sempar.drift.policies import POLICIES
from sempar.drift.replay import replay
from sempar.drift.streams import drift_stream, request_table
from sempar.errors import InputError
from sempar.paths import assets_dir
from sempar.placement.rebalance import RebalanceConfig
from sempar.solve_options import SolveOptions
from sempar.trace import read_trace


@pytest.fixture(scope="module")
def stream():
    t = read_trace(assets_dir() / "traces" / "deepseek-v2-lite-esft.parquet", optional=("domain",))
    return drift_stream(t, "tasks")


def test_rebalance_config_declares_no_default_of_its_own():
    m = "deepseek-v2-lite"
    cfg = rebalance_config(m, max_imbalance=None, horizon_s=None)
    base = RebalanceConfig()
    assert (cfg.max_moves, cfg.max_imbalance, cfg.horizon_s, cfg.tokens_per_s) == \
        (base.max_moves, base.max_imbalance, base.horizon_s, base.tokens_per_s)
    assert cfg.expert_bytes == expert_bytes(m)
    assert rebalance_config(m, max_bytes=1e9).max_moves == MOVES_MAX
    assert rebalance_config(m, max_bytes=1e9, max_moves=3).max_moves == 3
    with pytest.raises(TypeError):
        rebalance_config(m, max_moove=3)


def test_replay_config_fits_every_policy_to_the_solves_cap():
    cfg = ReplayConfig.for_model("deepseek-v2-lite", 4, solve=SolveOptions(max_imbalance=1.07,
                                                                           redundant=4))
    assert cfg.rebalance.max_imbalance == 1.07 and cfg.redundant == 4
    assert cfg.solve.jobs is None and ReplayConfig(ep=4).solve.jobs == 1
    assert ReplayConfig.for_model("deepseek-v2-lite", 4, every=None).every == ReplayConfig(ep=4).every


def test_engine_cadences_map_onto_steps():
    v, s = engines.CADENCES.get("vllm"), engines.CADENCES.get("sglang")
    assert [engines.updates_at(v, i, 1000) for i in range(7)] == \
        [False, False, False, True, False, False, True]
    assert all(engines.updates_at(s, i, 1000) for i in range(1, 5))
    assert engines.window_requests(v, 16, 1000) == engines.window_requests(s, 16, 1000) == 16
    assert engines.window_requests(v, 16, 500) == 32


def test_unavailable_engine_is_refused_with_one_line(stream, monkeypatch):
    monkeypatch.setattr(engines.importlib.util, "find_spec", lambda name: None)
    why = engines.vllm_unavailable()
    assert why.startswith("vllm-eplb: vLLM is not installed") and "\n" not in why
    with pytest.raises(InputError, match="not installed"):
        replay(stream, ["static", "vllm-eplb"], ReplayConfig(ep=4, window=8, max_steps=2))


def _skip_unless(name):
    why = POLICIES.get(name).unavailable()
    if why:
        pytest.skip(why)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vllm-eplb", "sglang-eplb"])
def test_engine_policy_is_the_engines_own_map(stream, name):
    _skip_unless(name)
    cfg = ReplayConfig.for_model(stream.meta.model, 4, solve=SolveOptions(jobs=1, redundant=4),
                                 every=8, window=8, max_steps=4, dispatch="locality-first")
    seen = []
    out = replay(stream, [name], cfg, on_step=lambda n, f, p: seen.append(p))
    pol = out["policies"][name]
    every = 3 if name == "vllm-eplb" else 1
    assert [s["updated"] for s in pol["steps"]] == [i > 0 and i % every == 0 for i in range(4)]
    assert seen[0].num_slots == stream.meta.num_experts + 4
    # the map after the first update is the engine's own result on the step's window
    i = every
    _, _, rows, starts = request_table(stream)
    a = 8 + 8 * i
    win = stream.take(rows[starts[a - 8]:starts[a]])
    call = engines.vllm_map if name == "vllm-eplb" else engines.sglang_map
    g = engines._groups(win) if name == "vllm-eplb" else None
    want = call(engines.expert_load(win), seen[i - 1], g)
    assert np.array_equal(seen[i].phy2log, want)
    assert pol["migrated_bytes"] == pol["migrated_experts"] * cfg.rebalance.expert_bytes
    assert 0 < pol["lar_mean"] < 1 and pol["imbalance_p95"] >= 1


@pytest.mark.slow
def test_replicas_and_dispatch_side_by_side(stream):
    cfg = ReplayConfig.for_model(stream.meta.model, 4, solve=SolveOptions(jobs=1, redundant=4),
                                 rebalance=dict(max_moves=4), every=8, window=8, max_steps=3,
                                 dispatch="locality-first")
    seen = {}
    out = replay(stream, ["eplb-periodic", "sempar-incremental"], cfg,
                 on_step=lambda n, f, p: seen.setdefault(n, []).append(p))
    assert out["redundant"] == 4 and out["dispatch"] == "locality-first"
    for n, ps in seen.items():
        assert all(p.num_slots == stream.meta.num_experts + 4 for p in ps)
        assert out["policies"][n]["updates"] == 2
    near = replay(stream, ["eplb-periodic"], cfg.with_(dispatch="sglang-dynamic"))
    # a random spread over copies gives up locality the home copy had
    assert near["policies"]["eplb-periodic"]["lar_mean"] < \
        out["policies"]["eplb-periodic"]["lar_mean"]


@pytest.mark.slow
def test_sempar_engine_runs_at_its_hosts_cadence(stream):
    _skip_unless("sempar-engine")
    _skip_unless("vllm-eplb")
    cfg = ReplayConfig.for_model(stream.meta.model, 4, solve=SolveOptions(jobs=1, redundant=4),
                                 every=8, window=8, max_steps=4, dispatch="vllm-hash",
                                 engine="vllm")
    seen = []
    out = replay(stream, ["sempar-engine"], cfg, on_step=lambda n, f, p: seen.append(p))
    pol = out["policies"]["sempar-engine"]
    assert pol["cadence"]["interval"] == 3000 and pol["updates"] == 1
    assert [s["updated"] for s in pol["steps"]] == [False, False, False, True]
    # every slot holds an expert, every expert at least once, never twice on one device
    p = seen[3]
    assert p.phy2log.shape == (stream.meta.num_layers, stream.meta.num_experts + 4)
    p.validate()
    assert pol["fallbacks"] == [] or all(f.startswith("step 3") for f in pol["fallbacks"])


@pytest.mark.slow
def test_replay_cli_takes_replicas_and_dispatch(stream, tmp_path):
    from sempar.trace.io import write_trace

    write_trace(stream.take(np.arange(4000)), tmp_path / "s.parquet")
    r = run_cli("replay", "--trace", tmp_path / "s.parquet", "--ep", "4", "--policies",
                "eplb-periodic,sempar-incremental", "--every", "8", "--window", "6",
                "--max-steps", "2", "--max-moves", "4", "--redundant", "4", "--dispatch",
                "locality-first", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["redundant"] == 4 and out["dispatch"] == "locality-first"
    assert out["rebalance"]["max_moves"] == 4 and out["max_imbalance"] == 1.05
    bad = run_cli("replay", "--trace", tmp_path / "s.parquet", "--ep", "4", "--engine", "tgi")
    assert bad.returncode == 2 and "tgi" in bad.stderr and "sglang" in bad.stderr


def test_results_page_from_the_benchmarks_json(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "make_results", Path(__file__).parents[2] / "scripts" / "make_results.py")
    mr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mr)
    pol = {"lar_mean": 0.45, "imbalance_p95": 1.2, "imbalance_layer_p95": 1.3,
           "migrated_bytes": 2e9, "migrated_bytes_per_step": 2e8, "moves_per_step": 3.0,
           "updates": 3, "fallbacks": [], "solve_s_mean": 0.5}
    case = {"suite": "engines", "stream": "esft-tasks", "model": "deepseek-v2-lite", "ep": 8,
            "redundant": 8, "dispatch": "vllm-hash", "engine": "vllm", "requests": 173,
            "steps": 10, "every": 16, "window": 16,
            "policies": {"sempar-engine": {**pol, "imbalance_mean": 1.1,
                                           "imbalance_step_max": 1.25},
                         "vllm-eplb": {**pol, "lar_mean": 0.3}},
            "unavailable": {"sglang-eplb": "sglang-eplb: SGLang is not installed"},
            "verdicts": {"against": "vllm-eplb", "lar_ratio": 1.5, "lar_ge_1.20x": True}}
    (tmp_path / "d.json").write_text(json.dumps([case]) + "\n")
    assert mr.main([str(tmp_path / "d.json"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "drift-engines.md").read_text()
    assert "## engines: esft-tasks (deepseek-v2-lite), EP 8, R 8, dispatch vllm-hash" in text
    assert "| sempar-engine | 0.4500 | 1.200 | 1.300 | 2.0 | 0.20 | 3.0 | 3 | 0 | 0.50 |" in text
    assert "unavailable: sglang-eplb: SGLang is not installed" in text
    assert "lar_ratio 1.500" in text and "| load average at generation" in text
    assert "| 1.200 / 1.200 | 1.100 / 1.250, - / - |" in text     # mean / worst step beside p95


def test_engine_ceiling_candidates_fill_the_replica_slots(stream):
    """`references.filled`: an R = 0 placement with R / G extra slots a device, each a
    copy of an expert the device lacks (valid: no expert twice on a device), the cold rule's
    copies the least-loaded experts; and the engines suite's ceiling column on the page."""
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).parents[2] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location("bde", bench / "bench_drift_engines.py")
        bde = importlib.util.module_from_spec(spec)
        sys.modules["bde"] = bde              # its dataclasses look their module up there
        spec.loader.exec_module(bde)
    finally:
        sys.path.remove(str(bench))
        sys.modules.pop("bde", None)
    from sempar.drift.references import filled
    from sempar.placement import solve
    from sempar.solve_options import SolveOptions

    G, N = 4, stream.meta.num_experts
    p0 = solve("eplb", stream, num_devices=G, options=SolveOptions(jobs=1))
    load = np.bincount(stream.experts[:, 0].ravel(), minlength=N)
    for rule in ("home-hot", "cold"):
        p = filled(p0, G, stream.experts, 16, rule)
        assert p.phy2log.shape == (p0.num_layers, N + G)
        rows = p.phy2log.reshape(p0.num_layers, G, -1)
        assert all(len(set(r)) == r.size for rr in rows for r in rr)      # distinct per device
        if rule == "cold":
            extra = rows[0, :, -1]
            assert load[extra].max() <= np.sort(load)[G + N // G], (extra, load)
    v = bde.engine_verdicts({"engine": "vllm", "oracle": {"lar_mean": 0.39,
                                                          "imbalance_p95": 1.3},
                             "policies": {"sempar-engine": {"lar_mean": 0.33,
                                                            "imbalance_p95": 1.3,
                                                            "migrated_bytes": 1.0},
                                          "vllm-eplb": {"lar_mean": 0.3, "imbalance_p95": 1.3,
                                                        "migrated_bytes": 2.0}}})
    assert abs(v["ceiling_lar_ratio"] - 1.3) < 1e-9 and v["lar_ge_1.20x"] is False


@pytest.mark.slow
def test_window_fed_reference_solves_only_at_the_engines_cadence():
    """`references.engine_window` (past-only): solves on the engine's window only before step 0
    and at the engine's rebalances (vLLM: every 3rd step), holds its pick between them, and
    never sees the step it serves (a change to a later step's requests changes nothing
    before it); the hindsight ceiling picks per step."""
    from sempar.drift.references import REFERENCES

    t = read_trace(assets_dir() / "traces" / "gpt-oss-20b-mmlu.parquet", optional=("domain",))
    s = drift_stream(t, "groups", switch_every=4)
    cfg = ReplayConfig.for_model(t.meta.model, 4, every=4, window=4, max_steps=4,
                                 passes_per_step=1000, engine="vllm",
                                 dispatch="vllm-hash")
    w = REFERENCES.get("engine-window").run(s, cfg, 1.3)
    assert len(w["picked"]) == 2 and len(w["lar_steps"]) == 4      # steps 0 and 3
    assert w["window_requests"] == 4 and w["cap"] == pytest.approx(1.32)
    assert [f["cap"] for f in w["frontier"]] == [w["cap"]]          # the target's bound
    h = REFERENCES.get("engine-hindsight").run(s, cfg, 1.3)
    assert len(h["picked"]) == 4
    assert not REFERENCES.get("engine-window").hindsight and REFERENCES.get(
        "engine-hindsight").hindsight
    short = REFERENCES.get("engine-window").run(s, cfg.with_(max_steps=3), 1.3)
    assert short["lar_steps"] == w["lar_steps"][:3]                # no step sees its own
