"""The `serve` stage of `sempar demo`: what to deploy for a real model's routing, on GPUs and
their links. Each case is a real-model trace shipped with sempar (assets/traces, NOTICE:
DeepSeek-V2-Lite's ESFT prefill routing, GPT-OSS-20B's MMLU routing, imported from
shared/data/real/full-traces by scripts/make-real-assets.sh), dimensions from the architecture (serving/dims.py) and the H100 roofline, at EP 8 on
one PCIe/UPI server (`pcie-upi8`) and on two 4-GPU nodes over InfiniBand (`a100x4-ib`).
`sempar plan` runs per case with a small candidate set and short runs (`DemoServeConfig`) so
the demo stays within its time budget; the stage's section opens the report (report.py).

The traces are copied into the demo's folder (data/<model>.parquet), so the commands the
plan prints name files that exist once the demo has finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sempar.comm.topology_presets import load_topology
from sempar.serving.dims import model_dims
from sempar.serving.forecast import Forecaster
from sempar.serving.setup import accelerator_for
from sempar.serving.metrics import SLOSpec
from sempar.serving.plan import PlanOptions, plan
from sempar.serving.workload import WorkloadSpec
from sempar.serving.slo_search import SearchConfig


@dataclass(frozen=True)
class DemoCase:
    model: str                      # packaged real trace (paths.REAL_TRACES) and preset name
    methods: tuple[str, ...]
    solve_rows: tuple[tuple[str, int], ...] = ()    # Forecaster.solve_rows: a time budget


@dataclass(frozen=True)
class DemoServeConfig:
    """The demo's plan settings: the whole space at a small size. Per model and topology:
    placements vanilla, eplb and `sempar`, redundancy 0 and G, pipelines `sglang-ep` (SGLang's
    Attention-DP launch) and `smoe-exact` (Sem-MoE's Attention-TP token shuffle with exact
    pre-routing), Attention-DP request policies round-robin, `balanced` and the router's
    `expert` (the last two score tokens: skipped, and said, for DeepSeek-V2-Lite, which has no
    token ids). Every candidate is screened; the `top` best and the best of each pipeline are
    forecast in full under the same SLO search. Placements are solved once per model and
    reused across topologies (Forecaster.share_placements). `sempar` solves on part of the fit
    split (whole requests, seeded), a time budget: DeepSeek-V2-Lite on 1,500 of its 6,653 rows
    (its rows objective at EP 8 takes minutes on a 2-core machine), GPT-OSS-20B on 6,000 of
    its 30,674 (its four solves -- rows and token objectives, 0 and G replica slots -- were
    most of the demo's serving stage); the placement's `solved_on_rows` and the printed
    commands say so."""

    cases: tuple[DemoCase, ...] = (
        DemoCase("deepseek-v2-lite", ("vanilla", "eplb", "sempar"), (("sempar", 1500),)),
        DemoCase("gpt-oss-20b", ("vanilla", "eplb", "sempar"), (("sempar", 6000),)))
    topologies: tuple[str, ...] = ("pcie-upi8", "a100x4-ib")
    accelerator: str = "h100"
    accelerator_profile: str | None = None   # a profile file; None: the shipped one
    pipelines: tuple[str, ...] = ("sglang-ep", "smoe-exact")
    policies: tuple[str, ...] = ("round-robin", "expert")
    redundant: tuple[str, ...] = ("0", "G")
    duration: float = 3.0
    n_rates: int = 4
    top: int = 1
    input_len: int = 512
    output_len: int = 128
    search: SearchConfig = field(default_factory=SearchConfig)


def import_case(case: DemoCase, out: Path) -> Path:
    """The case's packaged real trace (paths.real_trace_path) copied to `out`, a file inside
    the demo's own work folder (copied once)."""
    import shutil

    from sempar.paths import real_trace_path

    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real_trace_path(case.model), out)
    return out


def plan_case(trace_file: Path, printed: str, topology: str, cfg: DemoServeConfig,
              methods, fc_cache: dict | None = None, progress=None, solve_rows=()) -> dict:
    """`sempar plan` on one trace and topology; `printed` is the trace path its commands name.
    `fc_cache` shares placements between topologies of the same devices and nodes."""
    from sempar.comm.pipelines import PIPELINES
    from sempar.trace import read_trace

    tr = read_trace(trace_file)
    fc = Forecaster(tr, model_dims(tr.meta.model), load_topology(topology),
                    accelerator_for(cfg.accelerator, cfg.accelerator_profile),
                    solve_rows=dict(solve_rows))
    if fc_cache is not None:
        fc.share_placements(fc_cache.setdefault((str(trace_file), fc.G, fc.topo.num_nodes), fc))
    return plan(lambda G: fc, [fc.G], printed,
                WorkloadSpec(duration=cfg.duration, input_len=cfg.input_len,
                             output_len=cfg.output_len, n_rates=cfg.n_rates),
                SLOSpec(),
                PlanOptions(top=cfg.top, methods=tuple(methods), policies=cfg.policies,
                            pipelines=tuple(p for p in cfg.pipelines if p in PIPELINES),
                            search=cfg.search, redundant=cfg.redundant, attribute=True,
                            per_pipeline=True), progress=progress)


def run_stage(ctx, cfg: DemoServeConfig = DemoServeConfig()) -> dict | None:
    from sempar.serving.plots import plot_curves, plot_gains
    from sempar.serving.report import answer_section, evidence_section

    n0 = len(ctx.report.parts)
    results, cache = [], {}
    for case in cfg.cases:
        rel = Path("data") / f"{case.model}.parquet"
        path = import_case(case, ctx.work / rel)
        printed = str((ctx.out or ctx.work) / rel)
        for topo in cfg.topologies:
            ctx.step(f"plan {case.model} on {topo}")
            res = plan_case(path, printed, topo, cfg, case.methods, cache, ctx.step,
                            case.solve_rows)
            png = ctx.work / "figures" / f"serve_{case.model}_{topo.replace(':', '_')}.png"
            res["png"] = str(plot_curves(curves_of(res), png))
            results.append(res)
    chart = plot_gains(results, ctx.work / "figures" / "serve_gains.png")
    answer_section(ctx.report, results, chart)
    ctx.report.heading("Evidence: every plan")
    for res in results:
        evidence_section(ctx.report, res, Path(res["png"]))
    if n0:
        ctx.report.heading("Appendix: sempar's stages on the tiny models' dev traces and the "
                           "real routing's statistics")
    # the answer and its evidence open the report; the earlier stages follow as the appendix
    ctx.report.parts[:] = ctx.report.parts[n0:] + ctx.report.parts[:n0]
    keep = ("model", "topology", "eps", "accelerator", "compute_model", "sensitivity", "slos", "slo_keys", "rates", "noise", "choice",
            "attribution", "search", "budget", "wall_seconds")
    return {"cases": [{**{k: r[k] for k in keep},
                       "baseline": {k: v for k, v in r["baseline"].items() if k != "curve"},
                       "ranked": [{k: v for k, v in x.items() if k != "curve"}
                                  for x in r["ranked"]]} for r in results]}


def curves_of(res: dict) -> dict:
    """A plan result in the shape plot_curves reads: the baseline's and each ranked
    deployment's grid curve, the SLOs of the plan's keys."""
    from sempar.serving.metrics import SLO_KEYS

    systems = {"SGLang (vanilla/sglang-ep/round-robin)": {"curve": res["baseline"]["curve"]}}
    for r in res["ranked"]:
        systems[f"{r['placement']}/{r['pipeline']}/{r['policy']}"] = {"curve": r["curve"]}
    return {"systems": systems, "slos": {k: res["slos"][k] for k in SLO_KEYS},
            "model": res["model"], "topology": res["topology"], "accelerator": res["accelerator"],
            "ep": res["eps"][0], "slo_scale": 5.0}
