"""The `serve` stage of `sempar demo`: plan + systems side by side on the default 64-expert
trace, pcie-upi8, the `cpu` roofline, EP 8; a small candidate set and short runs (DEMO_DURATION
s of arrivals at DEMO_RATES rates) so the demo stays within its time budget. The section is
moved to the top of the report."""

from __future__ import annotations

from sempar.comm.pipelines import PIPELINES
from sempar.comm.topology_presets import load_topology
from sempar.serving.dims import model_dims
from sempar.serving.forecast import Forecaster, compare
from sempar.serving.hardware import ACCELERATORS
from sempar.serving.plan import plan
from sempar.serving.plots import plot_curves
from sempar.serving.report import plan_section, systems_section

DEMO_SYSTEMS = ["sglang", "semmoe-dp", "semmoe-tp", "sempar"]
DEMO_DURATION = 2.0
DEMO_RATES = 5          # from 5% to 120% of the best candidate's estimated capacity


def run_stage(ctx, name: str, trace) -> dict:
    fc = Forecaster(trace, model_dims(trace.meta.model), load_topology("pcie-upi8"),
                    ACCELERATORS.get("cpu"), budget=256, max_running=32)
    io = dict(input_len=128, output_len=32)
    p = plan(lambda G: fc, [fc.G], name, {}, n_rates=DEMO_RATES, duration=DEMO_DURATION, top=2,
             methods=["vanilla", "semmoe", "sempar"], policies=["round-robin", "alg2"],
             pipelines=[x for x in ("sglang-ep", "smoe-exact") if x in PIPELINES],
             **io, progress=ctx.step)
    rates = p["rates"]
    res = compare(fc, DEMO_SYSTEMS, rates, DEMO_DURATION, **io, progress=ctx.step)
    png = plot_curves(res, ctx.work / "figures" / "serve_curves.png")
    n0 = len(ctx.report.parts)
    plan_section(ctx.report, p)
    systems_section(ctx.report, res, png)
    ctx.report.parts[:] = ctx.report.parts[n0:] + ctx.report.parts[:n0]   # the plan opens the report
    return {"trace": name, "plan": {k: v for k, v in p.items() if k != "screened"},
            "systems": {n: {k: s[k] for k in ("config", "max_rate_under_slo", "throughput_under_slo")}
                        for n, s in res["systems"].items()}, "slos": res["slos"], "rates": rates}
