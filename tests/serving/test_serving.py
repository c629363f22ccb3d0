"""sempar.serving: closed forms (M/D/1 waiting, zero communication = the compute roofline,
more bandwidth never less throughput) and the `serve-sim` JSON contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sempar.comm.topology import Topology
from sempar.comm.topology_presets import load_topology
from sempar.serving.dims import model_dims
from sempar.serving.engine import EngineConfig, Workload, run
from sempar.serving.forecast import Forecaster, compare
from sempar.serving.metrics import SLOSpec
from sempar.serving.workload import WorkloadSpec
from sempar.serving.metrics import SLO_KEYS, run_metrics, weighted_quantile
from sempar.serving.roofline import Roofline
from sempar.serving.systems import SYSTEMS, resolve
from sempar.serving.workload import poisson_arrivals
from sempar.trace import read_trace

from conftest import SLOW


def _forecaster(path: Path, topo: Topology) -> Forecaster:
    tr = read_trace(path)
    return Forecaster(tr, model_dims(tr.meta.model), topo, SLOW, budget=256, max_running=32)


def _scaled(topo: Topology, alpha: float, beta: float) -> Topology:
    return Topology(f"{topo.name}-x", topo.node_of, topo.alpha * alpha, topo.beta * beta)


# ---- engine: M/D/1 ---------------------------------------------------------------------------
@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_waiting_time(rho):
    """One instance, one request at a time, one iteration of D seconds per request: FIFO M/D/1,
    mean wait = rho D / (2 (1 - rho)) (Pollaczek-Khinchine with zero service variance)."""
    D, n = 0.01, 60_000
    lam = rho / D
    arr = poisson_arrivals(lam, n / lam, np.random.default_rng(1))
    R = arr.size
    w = Workload(arr, np.full(R, 100), np.ones(R, np.int64), np.zeros(R, np.int32))
    cfg = EngineConfig(instances=1, budget=128, max_running=1, kv_capacity=1000)
    log = run(w, cfg, lambda p, d, a, k, s, i: np.full(len(i), D), horizon=10 * n / lam)
    wait = np.nanmean(log.first_token - arr) - D
    expect = rho * D / (2 * (1 - rho))
    assert abs(wait - expect) / expect < 0.05, (wait, expect)
    assert np.allclose(log.finish, log.first_token)


def test_chunked_prefill_and_decode_tokens():
    """A lone request of 300 tokens under a 128-token budget prefills in 3 iterations, then
    decodes one token per iteration: TTFT = 3 D, E2E = (3 + out - 1) D, TBT = D."""
    D = 0.002
    w = Workload(np.array([0.0]), np.array([300]), np.array([10]), np.array([0], np.int32))
    log = run(w, EngineConfig(1, 128, 4, 1000), lambda p, d, a, k, s, i: np.full(len(i), D), 1.0)
    assert log.first_token[0] == pytest.approx(3 * D)
    assert log.finish[0] == pytest.approx(12 * D)
    m = run_metrics(w, log, 1.0)
    assert m["p90_tbt"] == pytest.approx(D) and m["tpot_mean"] == pytest.approx(D)


def test_weighted_quantile():
    assert weighted_quantile(np.array([1.0, 2.0, 3.0]), np.array([8, 1, 1]), 0.9) == 2.0
    assert weighted_quantile(np.array([1.0, 2.0]), np.array([0, 5]), 0.5) == 2.0


# ---- forecasts on the tiny trace ------------------------------------------------------------
def test_zero_communication_is_the_compute_roofline(small_trace):
    topo = load_topology("pcie-upi8")
    fc = _forecaster(small_trace, _scaled(topo, 0.0, 0.0))
    p = fc.prepare(resolve("sglang").variants[0])
    assert not p.table.comm.any()
    # a lone request of 64 = 2^6 tokens: one prefill iteration, timed by the roofline alone
    w = Workload(np.array([0.0]), np.array([64]), np.array([1]), np.array([3], np.int32))
    log = run(w, p.cfg, p.step_seconds, 10.0)
    z = np.zeros((1, fc.G))
    pre = z.copy()
    pre[0, 3] = 64
    samp = z.copy()
    samp[0, 3] = 1
    want = p.roofline.dense_seconds(pre, z, pre * 65 / 2, pre, samp)[0] + p.table.expert[6, 0]
    assert log.first_token[0] == pytest.approx(want, rel=1e-12)
    real = _forecaster(small_trace, topo).prepare(resolve("sglang").variants[0])
    assert (real.table.comm[1:] > 0).all()         # the same batches with real links cost more
    assert np.allclose(real.table.expert, p.table.expert)


def test_doubling_bandwidth_never_lowers_throughput(small_trace):
    """Halving every link's seconds per byte: every tabulated batch communicates no slower,
    throughput at and beyond saturation is no lower, and the rate met under each SLO no lower.
    Below saturation throughput is the offered load, whatever the links; there the end of the
    last request may move by part of an iteration either way (a batching anomaly, not a
    bandwidth effect), so the two agree within 1%."""
    topo = load_topology("pcie-upi8")
    slo = {"ttft": 0.5, "tpot": 0.02, "p90_tbt": 0.02, "e2e": 2.0}
    slow_fc, fast_fc = (_forecaster(small_trace, _scaled(topo, 1.0, f)) for f in (1.0, 0.5))
    for name in ("sglang", "ds-moe"):
        v = resolve(name).variants[0]
        ps, pf = slow_fc.prepare(v), fast_fc.prepare(v)
        assert (pf.table.comm <= ps.table.comm).all() and (pf.table.comm < ps.table.comm).any()
        cap = ps.capacity(128, 16)
        rates = [round(cap * f, 1) for f in (0.3, 0.8, 2.0, 4.0)]
        load = WorkloadSpec(rates=tuple(rates), duration=600 / rates[-1], input_len=128,
                            output_len=16)
        slow, fast = (compare(fc, [name], load, SLOSpec(given=slo)) for fc in (slow_fc, fast_fc))
        for a, b in zip(slow["systems"][name]["curve"], fast["systems"][name]["curve"]):
            if a["rate"] >= 2 * cap:
                assert b["throughput"] >= a["throughput"], (name, a["rate"])
            else:
                assert b["throughput"] == pytest.approx(a["throughput"], rel=0.01), (name, a["rate"])
        assert fast["systems"][name]["curve"][-1]["throughput"] > slow["systems"][name]["curve"][-1]["throughput"]
        for k in SLO_KEYS:
            ra, rb = (o["systems"][name]["max_rate_under_slo"][k] for o in (slow, fast))
            assert (rb or 0) >= (ra or 0)


def test_every_system_resolves_against_the_registries():
    from sempar.comm.pipelines import PIPELINES
    from sempar.placement import SOLVERS
    from sempar.schedule.requests import REQUEST_POLICIES

    assert {"sglang", "sglang-eplb", "moetuner", "semmoe-dp", "semmoe-tp", "smoe", "ds-moe",
            "exflow", "sempar"} <= set(SYSTEMS.names())
    for name in SYSTEMS.names():
        for v in resolve(name).variants:
            SOLVERS.get(v.placement), PIPELINES.get(v.pipeline), REQUEST_POLICIES.get(v.policy)


# ---- CLI ------------------------------------------------------------------------------------
def sempar(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sempar.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_serve_sim_json_contract(small_trace):
    r = sempar("serve-sim", "--trace", str(small_trace), "--topology", "a100x4-ib", "--ep", "8",
               "--accelerator", "cpu", "--systems", "sglang,semmoe-dp", "--rates", "20,60",
               "--duration", "3", "--input-len", "128", "--output-len", "16", "--token-budget",
               "256", "--max-running", "32", "--plot", "plots", "--json", cwd=small_trace.parent)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["ep"] == 8 and d["topology"] == "a100x4-ib" and d["wall_seconds"] > 0
    assert set(d["slos"]) == set(SLO_KEYS) and all(v > 0 for v in d["slos"].values())
    assert list(d["systems"]) == ["sglang", "semmoe-dp"]
    for s in d["systems"].values():
        assert set(s["max_rate_under_slo"]) == set(SLO_KEYS) == set(s["throughput_under_slo"])
        assert [p["rate"] for p in s["curve"]] == [20.0, 60.0]
        for p in s["curve"]:
            assert {"rate", "throughput", "ttft_p99", "e2e_p50", "tpot_mean", "p90_tbt"} <= set(p)
    assert (small_trace.parent / "plots" / "serve-sim-curves.png").stat().st_size > 10_000


@pytest.mark.parametrize("args, words", [
    (("--systems", "nope"), "serving system"),
    (("--slo", "latency=3"), "--slo"),
    (("--rates", "0"), "--rates"),
    (("--ep", "6"), "--ep 6"),
    (("--accelerator", "tpu"), "accelerator"),
])
def test_serve_sim_bad_input(small_trace, args, words):
    r = sempar("serve-sim", "--trace", str(small_trace), "--accelerator", "cpu", "--duration",
               "1", "--json", *args, cwd=small_trace.parent)
    assert r.returncode == 2 and r.stdout == ""
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_plan_json_contract(small_trace):
    r = sempar("plan", "--trace", str(small_trace), "--topology", "pcie-upi8", "--ep", "8",
               "--accelerator", "cpu", "--methods", "vanilla,semmoe", "--pipelines", "sglang-ep",
               "--policies", "round-robin,alg2", "--top", "2", "--rates", "20,60", "--duration",
               "2", "--input-len", "128", "--output-len", "16", "--token-budget", "256",
               "--max-running", "32", "--json", cwd=small_trace.parent)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["screened"]) == 4 and len(d["ranked"]) == 2
    thr = [x["throughput_under_slo"] or 0 for x in d["ranked"]]
    # the recommended one first (the leader, or a simpler one within the noise), then by figure
    assert thr[1:] == sorted(thr[1:], reverse=True)
    assert thr[0] >= (1 - d["noise"]) * max(thr) or d["ranked"][0]["throughput_interval"][1] >= max(thr)
    assert d["choice"]["prefers_simpler"] == (thr[0] < max(thr))
    for x in d["ranked"]:
        assert {"pipeline", "placement", "policy", "redundant", "ep", "throughput_under_slo",
                "rate_interval", "commands"} <= set(x)
        lo, hi = x["rate_interval"]
        assert lo == x["max_rate_under_slo"] and (hi is None or lo < hi)
        assert x["ep"] == 8 and x["pipeline"] == "sglang-ep"
        assert (x["placement"] == "vanilla") != any(
            c.startswith("sempar place") and f"--method {x['placement']}" in c for c in x["commands"])
        assert any("--attn-dp-size 8" in c for c in x["commands"])


# ---- DP ranks on the served lengths, SLOs per attention mode -------------------------------
def test_tiled_requests_repeat_each_request_from_its_start():
    from sempar.serving.ranks import served_lengths, tiled_requests

    tok, off = tiled_requests(np.array([5, 6, 7, 8, 9]), np.array([0, 3, 5]), np.array([4, 1]))
    assert tok.tolist() == [5, 6, 7, 5, 8] and off.tolist() == [0, 4, 5]
    assert served_lengths(np.array([3, 9]), "trace", 100, 10).tolist() == [13, 19]
    assert served_lengths(np.array([3, 9]), "fixed", 100, 10).tolist() == [110, 110]


def test_balanced_policy_balances_the_served_requests(small_trace):
    """With fixed lengths every request costs the same, so `balanced` (5 % slack) must give
    every DP rank the same number of requests within a few, whatever the trace's lengths."""
    fc = _forecaster(small_trace, load_topology("pcie-upi8"))
    dp = resolve("sempar").variants[0]
    assert dp.policy == "balanced"
    p = fc.prepare(dp, served=("fixed", 128, 16))
    per = np.bincount(p.request_rank, minlength=fc.G)
    assert per.max() - per.min() <= max(2, 0.05 * per.mean()), per.tolist()


def test_slos_are_set_per_attention_mode(small_trace):
    fc = _forecaster(small_trace, load_topology("pcie-upi8"))
    res = compare(fc, ["sglang", "ds-moe", "sglang-eplb"],
                  WorkloadSpec(rates=(20.0, 60.0), duration=2.0, input_len=128, output_len=16))
    assert res["slo_baselines"] == {"dp": "sglang", "tp": "ds-moe"}
    for name, base in (("sglang", "sglang"), ("ds-moe", "ds-moe"), ("sglang-eplb", "sglang")):
        light = res["systems"][base]["curve"][0]
        s = res["systems"][name]
        assert s["slo_baseline"] == base
        assert s["slos"]["e2e"] == pytest.approx(5 * light["e2e_p50"])
        assert s["slos"]["ttft"] == pytest.approx(5 * light["ttft_p99"])
    assert res["slos"] == res["slos_by_attention"]["dp"] != res["slos_by_attention"]["tp"]
    given = compare(fc, ["sglang", "ds-moe"],
                    WorkloadSpec(rates=(20.0,), duration=2.0, input_len=128, output_len=16),
                    SLOSpec(given={"e2e": 3.0}))
    assert {m: s["e2e"] for m, s in given["slos_by_attention"].items()} == {"dp": 3.0, "tp": 3.0}


# ---- the forecast against sempar bench -------------------------------------------------------
def test_bench_methods_map_to_serving_variants():
    from sempar.comm.pipelines import PIPELINES
    from sempar.placement import SOLVERS
    from sempar.bench import METHODS
    from sempar.serving.benchcheck import bench_variant, measured_layer_seconds

    for m in map(METHODS.get, METHODS):
        solver, sched, pipe = m.placement, m.scheduling, m.pipeline
        v = bench_variant({"placement": solver, "scheduling": sched, "pipeline": pipe})
        SOLVERS.get(v.placement), PIPELINES.get(v.pipeline)
        assert v.pipeline == pipe and v.placement == solver
    assert measured_layer_seconds({"moe_layer_seconds": 0.3, "layer_seconds": 0.2}) == 0.2
    assert measured_layer_seconds({"moe_layer_seconds": 0.3}) == 0.3


def test_bench_forecast_is_calibrated_compute_plus_communication(small_trace):
    from sempar.errors import InputError
    from sempar.serving.benchcheck import bench_dims, calibrated_cpu, compare_bench, iteration_inputs

    tr = read_trace(small_trace)
    dims = bench_dims(model_dims(tr.meta.model))
    acc = calibrated_cpu(dims, 8, 64, 0.5)
    one = Roofline(dims, acc, 1, tp=False)           # the whole batch on one device takes 0.5 s
    L = dims.moe_layers
    t = one.dense_seconds(*iteration_inputs(1, 8, 64))[0] + one.expert_seconds(
        np.full((L, 1), 8 * 64 * dims.top_k), np.full((L, 1), dims.num_experts))
    assert t == pytest.approx(0.5)
    topo = load_topology("a100x4-ib:1")
    bench = {"hosts": topo.num_devices, "batch_size": 8, "seq": 64, "methods": {
        m: {"placement": "vanilla", "scheduling": s, "pipeline": p, "moe_layer_seconds": 0.1}
        for m, s, p in (("dp", "round-robin", "sglang-ep"), ("tp", "contiguous", "ds-moe"))}}
    res = {f: compare_bench(bench, Forecaster(tr, dims, tp, acc))
           for f, tp in (("real", topo), ("free", _scaled(topo, 0.0, 0.0)))}
    layers = dims.moe_layers + dims.dense_layers
    for m in ("dp", "tp"):
        free, real = res["free"][m], res["real"][m]
        assert free["forecast_comm_layer_seconds"] == 0.0
        assert free["forecast_layer_seconds"] == pytest.approx(free["forecast_compute_layer_seconds"])
        assert real["forecast_layer_seconds"] > free["forecast_layer_seconds"]
        assert real["ratio"] == pytest.approx(real["forecast_layer_seconds"] / 0.1)
        # bench's layer clock stops before the LM head: the forecast leaves it out too
        assert real["forecast_head_seconds"] > 0
        assert real["forecast_forward_seconds"] - real["forecast_head_seconds"] == \
            pytest.approx(real["forecast_layer_seconds"] * layers)
        # term by term: MoE block (all-to-alls + experts) and attention collectives within comm
        assert real["forecast_attn_comm_seconds"] + real["forecast_a2a_layer_seconds"] == \
            pytest.approx(real["forecast_comm_layer_seconds"])
        assert real["forecast_moe_block_seconds"] > real["forecast_a2a_layer_seconds"] > 0
    # DP: every rank computes 1/G of the batch, so less than the single device did
    assert res["free"]["dp"]["forecast_layer_seconds"] * layers < 0.5
    with pytest.raises(InputError, match="hosts"):
        compare_bench({**bench, "hosts": 3}, Forecaster(tr, dims, topo, acc))


def test_sensitivity_reprices_cached_batches_as_a_fresh_forecast(small_trace):
    """A compute-scaled copy (sensitivity.scaled) reuses the simulated batches of the step
    table and only re-prices the experts: the same table as a forecaster built at that scale;
    the plan's screen table holds the full-budget bucket alone and estimates capacity from it."""
    from dataclasses import replace

    from sempar.serving.sensitivity import scaled

    topo = load_topology("pcie-upi8")
    v = resolve("sglang").variants[0]
    fc = _forecaster(small_trace, topo)
    p = fc.prepare(v)
    slow = scaled(fc, 1.3).prepare(v)
    assert len(fc._steps) == 1                      # the scaled copy hit the cache
    fresh = _forecaster(small_trace, topo)
    fresh.acc = replace(fresh.acc, compute_scale=fresh.acc.compute_scale * 1.3)
    want = fresh.prepare(v)
    assert np.array_equal(slow.table.comm, want.table.comm)
    assert np.allclose(slow.table.expert, want.table.expert, rtol=1e-12)
    assert (slow.table.expert > p.table.expert)[p.table.count > 0].any()
    screen = fc.prepare(v, sample_tokens=2048, screen=True)
    assert screen.table.count[:-1].sum() == 0 and screen.table.count[-1] > 0
    assert screen.capacity(512, 128) == pytest.approx(p.capacity(512, 128), rel=0.15)


def test_tbt_is_measured_per_request(small_trace):
    """p90 TBT reads each request's span of iterations (first to last token): every running
    request gets a token in every iteration of its span (no request waits outside the batch
    in this engine), so the per-request gaps equal the iterations weighted by decode tokens,
    and a request's gaps add up to its time from first to last token."""
    from sempar.serving.engine import run
    from sempar.serving.metrics import request_gaps, run_metrics, weighted_quantile
    from sempar.serving.workload import make_workload, stable_arrivals

    fc = _forecaster(small_trace, load_topology("pcie-upi8"))
    p = fc.prepare(resolve("sglang").variants[0])
    cap = p.capacity(128, 16)
    for rate in (0.3 * cap, 3.0 * cap):             # light load and overload
        arr = stable_arrivals(rate, 2.0, 0)
        w = make_workload(arr, "fixed", 128, 16, p.request_tokens, p.request_rank,
                          np.random.default_rng(0))
        log = run(w, p.cfg, p.step_seconds, 4.0)
        gap, count = request_gaps(log)
        assert np.array_equal(count, log.it_decode)
        held = count > 0
        assert np.allclose(gap[held], log.it_dt[held])
        done = log.last_it >= 0
        ends = log.it_end
        span = ends[log.last_it[done]] - ends[log.first_it[done]]
        fin = np.isfinite(log.finish)
        assert np.allclose(span[fin[done]], (log.finish - log.first_token)[fin & done])
        m = run_metrics(w, log, 2.0)
        assert m["p90_tbt"] == pytest.approx(weighted_quantile(log.it_dt, log.it_decode, 0.9))
