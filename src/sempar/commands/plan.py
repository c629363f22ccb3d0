"""`sempar plan`: rank deployments by forecast throughput under an SLO and print the winner
with its export commands and engine flags (sempar.serving.plan)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.commands._names import accelerators, names_option, pipelines, request_policies, solvers
from sempar.commands._options import (COLLECTIVES_HELP, RATES, budget_option, duration_option,
                                      ep_list_option, ep_values, input_len_option, json_option,
                                      max_running_option, output_len_option, rates_option,
                                      seed_option, slo_option)
from sempar.bounds import REDUNDANT_MAX, Bounds, NumberList, bound
from sempar.commands._options import collectives as check_collectives
from sempar.model_presets import names as preset_names
from sempar.commands._options import accelerator_profile_option


def _tuple(s: Optional[str]) -> Optional[tuple[str, ...]]:
    return None if s is None else tuple(x.strip() for x in s.split(",") if x.strip()) or None


REDUNDANT = NumberList("--redundant", Bounds(0, REDUNDANT_MAX, integer=True, words=("G",)))


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        trace: Path = typer.Option(..., "--trace", help="routing trace (Parquet)"),
        preset: Optional[str] = typer.Option(None, "--preset", help="model dimensions: "
                                             + ", ".join(preset_names()) + ", or a packaged "
                                             "tiny model (default: the trace's model)"),
        topology: str = typer.Option("pcie-upi8", "--topology", help="preset or topology JSON"),
        accelerator: str = names_option("h100", "--accelerator", accelerators, single=True,
                                        help="accelerator"),
        accelerator_profile: Optional[Path] = accelerator_profile_option(),
        ep: Optional[str] = ep_list_option("EP sizes to try, comma-separated (default: "
                                                 "the topology's devices)"),
        slo: Optional[str] = slo_option("SLOs in seconds, e.g. e2e=10,ttft=0.5 (default: ttft "
                                        "and e2e at 5x SGLang's lightest load)"),
        methods: Optional[str] = names_option(None, "--methods", solvers,
                                              help="placement methods to try"),
        pipes: Optional[str] = names_option(None, "--pipelines", pipelines,
                                            help="pipelines to try"),
        policies: Optional[str] = names_option(None, "--policies", request_policies,
                                               help="DP request policies to try"),
        redundant: str = typer.Option("0", "--redundant", callback=REDUNDANT.callback,
                                      help="redundant slots per layer to try (comma-separated; "
                                      "G = one per device)"),
        rates: Optional[str] = rates_option("requests/s to sweep"),
        duration: float = duration_option(30.0),
        input_len: int = input_len_option(),
        output_len: int = output_len_option(),
        top: int = typer.Option(4, "--top", help="candidates forecast in full after screening",
                                callback=bound(1, 1000)),
        budget: int = budget_option(),
        max_running: int = max_running_option(),
        seed: int = seed_option(),
        collectives: Optional[str] = typer.Option(None, "--collectives", help=COLLECTIVES_HELP,
                                                  callback=check_collectives),
        per_pipeline: bool = typer.Option(True, "--per-pipeline/--top-only",
                                          help="also forecast in full the best screened "
                                               "deployment of every pipeline (default), so "
                                               "pipelines are compared under the SLO"),
        as_json: bool = json_option(),
    ) -> None:
        """Rank deployments (pipeline x placement x policy x redundancy x EP) by throughput under an SLO."""
        from sempar.progress import steps
        from sempar.serving.metrics import SLOSpec
        from sempar.serving.plan import PlanOptions, plan
        from sempar.serving.workload import WorkloadSpec
        from sempar.bounds import check_requests
        from sempar.serving.setup import forecaster, parse_slo

        given = parse_slo(slo)
        eps = ep_values(ep)
        red = [str(r) for r in REDUNDANT.parse(redundant)]
        rate_list = RATES.parse(rates)
        if rate_list:
            check_requests(rate_list, duration)
        fcs = {}

        def make_fc(G):
            fcs[G] = forecaster(trace, preset, topology, accelerator, G, None, budget, max_running,
                                seed, collectives, accelerator_profile)
            return fcs[G]

        eps = [make_fc(G).G for G in eps]
        with steps("plan", None) as step:
            res = plan(lambda G: fcs.get(G) or make_fc(G), eps, str(trace),
                       WorkloadSpec(rates=tuple(rate_list) if rate_list else None,
                                    duration=duration, input_len=input_len,
                                    output_len=output_len),
                       SLOSpec(given=given),
                       PlanOptions(top=top, methods=_tuple(methods), pipelines=_tuple(pipes),
                                   policies=_tuple(policies), redundant=tuple(red),
                                   per_pipeline=per_pipeline), progress=step)
        if as_json:
            from sempar.console import emit_json

            emit_json(res)
            return
        print_plan(res)


def print_plan(res: dict) -> None:
    from rich.table import Table

    from sempar.console import out

    keys = ", ".join(f"{k} {res['slos'][k] * 1e3:.1f} ms" for k in res["slo_keys"])
    base = res["baseline"]["throughput_under_slo"]
    t = Table(title=f"sempar plan: {res['model']} on {res['topology']} ({res['accelerator']}), "
                    f"SLO {keys}; SGLang baseline {base or 0:.0f} tokens/s; rates searched to "
                    f"{res['search']['tolerance']:.0%}")
    for c in ("rank", "pipeline", "placement", "policy", "redundant", "EP", "LAR",
              "req/s [interval]", "tokens/s", "x SGLang"):
        t.add_column(c, justify="right")
    for i, r in enumerate(res["ranked"], 1):
        thr = r["throughput_under_slo"]
        lo, hi = r["rate_interval"]
        t.add_row(str(i), r["pipeline"], r["placement"], r["policy"], str(r["redundant"]),
                  str(r["ep"]), "-" if r["lar"] is None else f"{r['lar']:.3f}",
                  "-" if lo is None else f"{lo:.3g} [{lo:.3g}, {'-' if hi is None else f'{hi:.3g}'}]",
                  "-" if thr is None else f"{thr:.0f}",
                  "-" if not (thr and base) else f"{thr / base:.2f}")
    out.print(t)
    if res["choice"].get("text"):
        out.print(res["choice"]["text"], soft_wrap=True)
    from sempar.serving.sensitivity import sensitivity_text

    for line in (f"compute: {res.get('compute_model', '')}", sensitivity_text(res)):
        if line.strip() != "compute:":
            out.print(line, soft_wrap=True, markup=False, highlight=False)
    if res["ranked"]:
        out.print("deploy the recommended one:")
        for c in res["ranked"][0]["commands"]:
            out.print("  " + c, soft_wrap=True, markup=False, highlight=False)
    sys.stderr.write(f"screened {len(res['screened'])} deployments, skipped "
                     f"{len(res['skipped'])}, forecast {len(res['ranked'])} in full\n")
