"""`sempar plan`: rank deployments by forecast throughput under an SLO and print the winner
with its export commands and engine flags (sempar.serving.plan)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.commands._options import (COLLECTIVES_HELP, ep_list_option, ep_values, json_option,
                                      seed_option)
from sempar.commands._options import collectives as check_collectives
from sempar.errors import InputError


def _names(s: Optional[str]) -> Optional[list[str]]:
    return None if s is None else [x.strip() for x in s.split(",") if x.strip()] or None


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        trace: Path = typer.Option(..., "--trace", help="routing trace (Parquet)"),
        preset: Optional[str] = typer.Option(None, "--preset", help="model dimensions (default: "
                                             "the trace's model)"),
        topology: str = typer.Option("pcie-upi8", "--topology", help="preset or topology JSON"),
        accelerator: str = typer.Option("h100", "--accelerator"),
        ep: Optional[str] = ep_list_option("EP sizes to try, comma-separated (default: "
                                                 "the topology's devices)"),
        slo: Optional[str] = typer.Option(None, "--slo", help="SLOs in seconds, e.g. e2e=10,ttft=0.5 "
                                          "(default: ttft and e2e at 5x SGLang's lightest load)"),
        methods: Optional[str] = typer.Option(None, "--methods", help="placement methods to try"),
        pipelines: Optional[str] = typer.Option(None, "--pipelines", help="pipelines to try"),
        policies: Optional[str] = typer.Option(None, "--policies", help="DP request policies to try"),
        redundant: str = typer.Option("0", "--redundant", help="redundant slots per layer to try "
                                      "(comma-separated; G = one per device)"),
        rates: Optional[str] = typer.Option(None, "--rates", help="requests/s to sweep"),
        duration: float = typer.Option(30.0, "--duration", help="seconds of arrivals per rate"),
        input_len: int = typer.Option(512, "--input-len"),
        output_len: int = typer.Option(128, "--output-len"),
        top: int = typer.Option(4, "--top", help="candidates forecast in full after screening"),
        budget: int = typer.Option(2048, "--token-budget", help="tokens per iteration per device"),
        max_running: int = typer.Option(128, "--max-running", help="running requests per device"),
        seed: int = seed_option(),
        collectives: Optional[str] = typer.Option(None, "--collectives", help=COLLECTIVES_HELP,
                                                  callback=check_collectives),
        as_json: bool = json_option(),
    ) -> None:
        """Rank deployments (pipeline x placement x policy x redundancy x EP) by throughput under an SLO."""
        from sempar.progress import steps
        from sempar.serving.plan import plan
        from sempar.serving.setup import forecaster, parse_floats, parse_slo

        given = parse_slo(slo)
        eps = ep_values(ep)
        red = []
        for r in _names(redundant) or ["0"]:
            if r != "G" and not r.isdigit():
                raise InputError(f"--redundant: {r!r} is not a count or G")
            red.append(r)
        if top < 1:
            raise InputError(f"--top: {top} is not positive")
        rate_list = parse_floats(rates, "--rates")
        fcs = {}

        def make_fc(G):
            fcs[G] = forecaster(trace, preset, topology, accelerator, G, None, budget, max_running,
                                seed, collectives)
            return fcs[G]

        eps = [make_fc(G).G for G in eps]
        with steps("plan", None) as step:
            res = plan(lambda G: fcs.get(G) or make_fc(G), eps, str(trace), given,
                       rates=rate_list, duration=duration, input_len=input_len,
                       output_len=output_len, top=top, methods=_names(methods),
                       pipelines=_names(pipelines), policies=_names(policies), redundant=red,
                       progress=step)
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
    if res["ranked"]:
        out.print("deploy the recommended one:")
        for c in res["ranked"][0]["commands"]:
            out.print("  " + c, soft_wrap=True, markup=False, highlight=False)
    sys.stderr.write(f"screened {len(res['screened'])} deployments, skipped "
                     f"{len(res['skipped'])}, forecast {len(res['ranked'])} in full\n")
