"""`sempar demo` stages downstream of scheduling: simulated communication, cost-aware routing,
the chiplet simulator, the last real EP benchmark, and the EPLB plug-in under drift. Registered after `demo.stages`' own
(importing this module registers them), each small enough for the demo's time budget.
"""

from __future__ import annotations

import numpy as np

from sempar.demo.stages import EVAL_TOKENS, STAGES, DemoContext, _sample_requests

SIM_METHODS = ["vanilla", "semmoe"]
SIM_PIPELINES = ["ds-moe", "smoe", "smoe-exact", "sglang-ep", "exflow"]
SIM_TOPOLOGIES = ["pcie-upi8", "a100x4-ib"]
COST_LAMBDAS = (0.0, 0.1, 0.25)
COST_TOKENS_PER_DOMAIN = 512


def on_moe64(stage):
    """Run `stage(ctx, name, trace)` on the first default trace with at least 16 experts (the
    64-expert model's); without one the stage contributes nothing."""
    from functools import wraps

    @wraps(stage)
    def run(ctx: DemoContext) -> dict:
        from sempar.trace import read_trace

        for name, entry in ctx.results["trace"].items():
            t = read_trace(entry["path"])
            if t.meta.num_experts >= 16:
                return stage(ctx, name, t)
        return {}

    return run


@STAGES.register("simulate")
@on_moe64
def stage_simulate(ctx: DemoContext, name: str, trace) -> dict:
    """Vanilla against sempar (semmoe + online schedulers) per pipeline on two topologies, EP 8."""
    from sempar.comm.compare import Study, plot_grid, run_grid
    from sempar.comm.simulate import SimOptions, resolve_hidden

    trace = _sample_requests(trace, int(EVAL_TOKENS / 0.8))
    opts = SimOptions(hidden=resolve_hidden(trace.meta.model, trace.meta.extra, None))
    rows = run_grid(Study.from_trace(trace, opts), SIM_METHODS, SIM_PIPELINES, SIM_TOPOLOGIES)
    ctx.report.heading(f"Communication on real links, simulated ({name}, EP 8)")
    ctx.report.paragraph("Per MoE layer, the bytes every device sends every other device, from the "
                         "held-out routing, the placement and the schedulers; all-to-all time per "
                         "CAMoE eq. 9 (max over pairs of alpha + beta x bytes), mean over batches "
                         "of 2,048 tokens. Ratios: vanilla's time / sempar's. smoe-exact pre-routes "
                         "exactly (an all-reduce of [T, N] router logits, in all comm).", note=True)
    ctx.report.table(["topology", "pipeline", "method", "a2a ms / batch", "x vanilla",
                      "all comm ms / batch", "bytes / token", "LAR"],
                     [[r["topology"], r["pipeline"], r["method"], r["a2a_seconds_mean"] * 1e3,
                       r["a2a_speedup"], r["comm_seconds_mean"] * 1e3, r["bytes_per_token"],
                       r["lar_mean"]] for r in rows])
    png = ctx.work / "figures" / "simulate.png"
    plot_grid(rows, png, f"{name}: vanilla vs sempar, EP 8")
    ctx.report.image(png)
    return {"trace": name, "rows": rows}


def _dev_sequences(trace, tokens_per_domain: int, seq_len: int = 256):
    """The dev trace's own held-out text (its token ids, request by request) as sweep input."""
    from sempar.costroute.text import chunk_streams

    streams: dict[str, list[list[int]]] = {}
    names = np.asarray(trace.domains + ["unknown"], dtype=object)
    dom = np.where(trace.domain < 0, len(trace.domains), trace.domain)
    for r in np.unique(trace.request_id):
        rows = np.flatnonzero(trace.request_id == r)
        rows = rows[np.argsort(trace.position[rows], kind="stable")]
        streams.setdefault(str(names[dom[rows[0]]]), []).append(trace.token_id[rows].tolist())
    return chunk_streams(streams, 0, seq_len, tokens_per_domain)


@STAGES.register("cost-route")
@on_moe64
def stage_cost_route(ctx: DemoContext, name: str, trace) -> dict:
    """CAMoE cost-aware routing: a short lambda sweep of the 64-expert model on hetero-cloud."""
    from sempar.costroute.report import pareto_plot
    from sempar.costroute.sweep import SweepConfig, run_sweeps

    cfg = SweepConfig(model=trace.meta.model, topologies=("hetero-cloud",), ep=8,
                      lambdas=COST_LAMBDAS, tokens_per_domain=COST_TOKENS_PER_DOMAIN,
                      seq_len=128, batch_size=4)
    res = run_sweeps(cfg, seqs=_dev_sequences(trace, COST_TOKENS_PER_DOMAIN, cfg.seq_len))
    ctx.report.heading(f"Cost-aware routing ({name} on hetero-cloud, EP 8)")
    ctx.report.paragraph(f"CAMoE §3.4 gate bias at each lambda on {COST_TOKENS_PER_DOMAIN} held-out "
                         "tokens per domain (a short sweep; benchmarks/bench_cost_routing.py runs "
                         "the full one). CAMoE reports -15.8% mean and -19.1% p95 all-to-all at "
                         "lambda 0.25 for about 1.2 accuracy points (Qwen3-30B-A3B).", note=True)
    pts = res[0]["points"]
    ctx.report.table(["lambda", "a2a mean change", "a2a p95 change", "accuracy change (points)",
                      "perplexity change", "KL vs lambda 0"],
                     [[p["lambda"], p["a2a_mean_change"], p["a2a_p95_change"],
                       p["acc_change_points"], p["ppl_change"], p.get("kl")] for p in pts])
    ctx.report.image(pareto_plot(res, ctx.work / "figures" / "cost_route_pareto.png"))
    return {"trace": name, "sweep": res}


@STAGES.register("stream")
@on_moe64
def stage_stream(ctx: DemoContext, name: str, trace) -> dict:
    """The FSE-DP chiplet simulator: every strategy, Qwen3-30B-A3B shape, 64 tokens/iteration."""
    from sempar.chiplet.flow import auto_micro_slices
    from sempar.chiplet.hardware import ChipletConfig
    from sempar.chiplet.models import MODELS, precision_bytes
    from sempar.chiplet.simulate import simulate
    from sempar.chiplet.strategies import resolve
    from sempar.chiplet.workload import assemble

    model, iters, tokens = MODELS.get("qwen3-30b-a3b"), 20, 64
    cfg = ChipletConfig()
    micro = auto_micro_slices(cfg, model.expert_params * precision_bytes("int8"))
    res = simulate(assemble(trace, model, tokens, iters, source=name), cfg, resolve("all"), "int8",
                   micro)
    base = res["ep"].layer_latency_s
    ctx.report.heading("Expert streaming on a 2x2 chiplet package (FSE-DP)")
    ctx.report.paragraph(f"{name}'s routing mapped onto the Qwen3-30B-A3B shape, {tokens} tokens per "
                         f"iteration, {iters} iterations, int8 weights; `sempar stream` runs 100 and "
                         "the sweeps. FSE-DP reports 1.22-2.00x over EP with paired-load.", note=True)
    ctx.report.table(["strategy", "layer latency (us)", "speedup vs EP", "utilization",
                      "peak on-chip (MiB)"],
                     [[n, r.layer_latency_s * 1e6, base / r.layer_latency_s, r.utilization,
                       r.peak_bytes / 2**20] for n, r in res.items()])
    return {"trace": name, "strategies": {n: r.to_json() for n, r in res.items()}}


@STAGES.register("bench")
def stage_bench(ctx: DemoContext) -> dict | None:
    """Quote the last `sempar bench` (real EP execution); the demo does not run it."""
    from sempar.bench import TABLE_HEADER, bench_table_rows, last_bench_result

    ctx.report.heading("Real expert-parallel execution (last `sempar bench`)")
    res = last_bench_result()
    if not res:
        ctx.report.paragraph("No `sempar bench` result on this machine yet: run `sempar bench "
                             "--ep 4` (a network-namespace testbed needs root).", note=True)
        return None
    ctx.report.paragraph(f"{res.get('hosts')} ranks, links shaped as {res.get('preset') or 'loopback'}, "
                         f"model {res.get('model')}.", note=True)
    ctx.report.table(TABLE_HEADER, bench_table_rows(res))
    return res


@STAGES.register("serve")
def stage_serve(ctx: DemoContext) -> dict | None:
    """Serving plan on the packaged real-model routing (sempar.serving.demo); its answer opens
    the report."""
    from sempar.serving.demo import DemoServeConfig, run_stage

    prof = str(ctx.accelerator_profile) if ctx.accelerator_profile else None
    return run_stage(ctx, DemoServeConfig(accelerator_profile=prof))


BALANCER_STEPS = 8              # replay steps of 16 requests: ~15 CPU s per slot setting
BALANCER_EP = 4


@STAGES.register("balancer")
def stage_balancer(ctx: DemoContext) -> dict | None:
    """The EPLB plug-in inside the engine's balancer (`sempar-engine`, docs/eplb-plugin.md)
    against DeepSeek EPLB, the engines' default (`eplb-periodic`), replayed on a task-switching
    stream of the packaged DeepSeek-V2-Lite routing (`drift.streams.drift_stream`, order
    "tasks") at EP 4: without replica slots (dispatch nearest), and with R = G slots and the
    `lp-cap` dispatch (`placement.dispatch`)."""
    from sempar.drift.config import ReplayConfig
    from sempar.drift.engines import sempar_unavailable
    from sempar.drift.plot import plot_replay
    from sempar.drift.replay import replay
    from sempar.drift.streams import drift_stream
    from sempar.paths import real_trace_path
    from sempar.solve_options import SolveOptions
    from sempar.trace import read_trace

    ctx.report.heading("Inside the engine's balancer: the sempar EPLB plug-in under drift")
    why = sempar_unavailable()
    if why:
        ctx.report.paragraph(why, note=True)
        return None
    stream = drift_stream(read_trace(real_trace_path("deepseek-v2-lite")), "tasks")
    policies = ["eplb-periodic", "sempar-engine"]
    rows, out = [], {}
    for R, dispatch in ((0, "nearest"), (BALANCER_EP, "lp-cap")):
        cfg = ReplayConfig.for_model("deepseek-v2-lite", BALANCER_EP, max_steps=BALANCER_STEPS,
                                     dispatch=dispatch,
                                     solve=SolveOptions(jobs=1, redundant=R))
        res = replay(stream, policies, cfg)
        out[f"R{R}"] = {n: {k: v for k, v in p.items() if k != "steps"}
                        for n, p in res["policies"].items()}
        base = res["policies"]["eplb-periodic"]
        for name, p in res["policies"].items():
            rows.append([R, dispatch, name, p["lar_mean"],
                         p["lar_mean"] / max(base["lar_mean"], 1e-12), p["imbalance_p95"],
                         p["migrated_bytes"] / 1e9])
        if R:
            png = ctx.work / "figures" / "balancer.png"
            png.parent.mkdir(parents=True, exist_ok=True)      # inside the demo's temporary folder
            plot_replay(res, png)
    ctx.report.paragraph("With `--enable-eplb`, an engine replaces any launch placement at its "
                         "first rebalance by DeepSeek EPLB's load-only layout. Set `SEMPAR_EPLB="
                         "FILE` and the plug-in takes that policy's place: it keeps the locality "
                         "FILE holds and balances the live window. Replayed here on "
                         f"{BALANCER_STEPS} steps of 16 requests of the packaged DeepSeek-V2-Lite "
                         f"routing, switching ESFT task every 16 requests, EP {BALANCER_EP}, at "
                         "vLLM's cadence (every 3rd step); the engines' own code runs in "
                         "`sempar replay --policies vllm-eplb,sglang-eplb,sempar-engine` "
                         "(the `engines` extra; docs/results/drift-engines.md).", note=True)
    ctx.report.table(["replica slots R", "dispatch", "policy", "LAR (exact homes)",
                      "x eplb-periodic", "imbalance p95", "migrated GB"], rows)
    ctx.report.image(png)
    return {"trace": "deepseek-v2-lite-esft", "ep": BALANCER_EP, "steps": BALANCER_STEPS,
            "policies": out}
