"""`sempar serve-sim`: a discrete-event serving forecast of several systems side by side,
throughput under TTFT / TPOT / p90-TBT / E2E SLOs and latency-throughput curves (sempar.serving)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.commands._names import accelerators, dispatch_option, names_option, serving_systems
from sempar.commands._options import (COLLECTIVES_HELP, RATES, accelerator_profile_option,
                                      budget_option, duration_option, ep_option, input_len_option,
                                      json_option, max_running_option, nodes_option,
                                      output_len_option, rates_option, seed_option, slo_option,
                                      slo_scale_option)
from sempar.commands._options import collectives as check_collectives
from sempar.model_presets import names as preset_names


def register(app: typer.Typer) -> None:
    @app.command("serve-sim")
    def serve_sim_cmd(
        trace: Path = typer.Option(..., "--trace", help="routing trace (Parquet): 20% fits the "
                                   "placements and schedulers, 80% is replayed"),
        preset: Optional[str] = typer.Option(None, "--preset", help="model dimensions: "
                                             + ", ".join(preset_names()) + ", or a packaged "
                                             "tiny model (default: the trace's model)"),
        topology: str = typer.Option("pcie-upi8", "--topology", help="preset or topology JSON"),
        nodes: Optional[int] = nodes_option(None, "nodes of a scalable preset"),
        accelerator: str = names_option("h100", "--accelerator", accelerators, single=True,
                                        help="accelerator"),
        accelerator_profile: Optional[Path] = accelerator_profile_option(),
        ep: Optional[int] = ep_option(None, "EP degree G (default: the topology's devices)"),
        systems: str = names_option("all", "--systems", serving_systems, words=("all",),
                                    help="all, or a comma-separated list; the first of each "
                                    "attention mode (DP, TP) is the baseline whose lightest load "
                                    "sets that mode's SLOs"),
        rates: Optional[str] = rates_option("requests/s, comma-separated (default: 10 rates up "
                                            "to 1.2 x the estimated capacity)"),
        arrivals: Optional[Path] = typer.Option(None, "--arrivals", help="arrival times (s) file "
                                                "instead of Poisson rates"),
        duration: float = duration_option(60.0),
        lengths: str = typer.Option("fixed", "--lengths", help="fixed, trace or exp"),
        input_len: int = input_len_option(),
        output_len: int = output_len_option(),
        slo_scale: float = slo_scale_option(),
        slo: Optional[str] = slo_option("given SLOs in seconds, e.g. e2e=10,ttft=0.5"),
        budget: int = budget_option(),
        max_running: int = max_running_option(),
        seed: int = seed_option(),
        collectives: Optional[str] = typer.Option(None, "--collectives", help=COLLECTIVES_HELP,
                                                  callback=check_collectives),
        plot: Optional[Path] = typer.Option(None, "--plot", help="folder for serve-sim-curves.png"),
        dispatch: str = dispatch_option(),
        as_json: bool = json_option(),
    ) -> None:
        """Forecast serving throughput under latency SLOs for several systems side by side."""
        from sempar.bounds import check_requests
        from sempar.progress import steps
        from sempar.serving.forecast import compare
        from sempar.serving.setup import forecaster, parse_slo
        from sempar.serving.systems import SYSTEMS
        from sempar.serving.metrics import SLOSpec
        from sempar.serving.workload import WorkloadSpec, read_arrivals

        names = SYSTEMS.names() if systems == "all" else [s.strip() for s in systems.split(",") if s.strip()]
        rate_list = RATES.parse(rates)
        if rate_list:
            check_requests(rate_list, duration)
        given = parse_slo(slo)
        if plot is not None:
            from sempar.atomic import check_output

            check_output(Path(plot) / "serve-sim-curves.png", trace, option="--plot")
        arr = read_arrivals(arrivals) if arrivals is not None else None
        if arr is not None:
            check_requests([float(arr.size)], 1.0, "--arrivals")
        fc = forecaster(trace, preset, topology, accelerator, ep, nodes, budget, max_running, seed,
                        collectives, accelerator_profile)
        fc.dispatch = dispatch
        n_steps = len(names) * (1 + (len(rate_list) if rate_list else 10))
        with steps("serve-sim", n_steps) as step:
            load = WorkloadSpec(rates=tuple(rate_list) if rate_list else None,
                                duration=duration, lengths=lengths, input_len=input_len,
                                output_len=output_len, arrivals=arr)
            res = compare(fc, names, load, SLOSpec(scale=slo_scale, given=given), progress=step)
        from sempar.serving.accel_profile import compute_model

        res["compute_model"] = compute_model(fc.acc)
        if plot is not None:
            from sempar.serving.plots import plot_curves

            res["png"] = str(plot_curves(res, Path(plot) / "serve-sim-curves.png"))
        if as_json:
            from sempar.console import emit_json

            emit_json(res)
            return
        print_result(res)
        if plot is not None:
            sys.stderr.write(f"wrote {res['png']}\n")


def _r(x, fmt="{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def _interval(found: dict | None, rate) -> str:
    """The rate under an SLO with the bracket the search ended on: meets [lo, hi) misses."""
    if not found or found["rate_interval"][1] is None or rate is None:
        return _r(rate)
    return f"{_r(rate)} [{_r(found['rate_interval'][1])})"


def print_result(res: dict) -> None:
    from rich.table import Table

    from sempar.console import out
    from sempar.serving.metrics import SLO_KEYS

    from sempar.serving.report import slo_text

    t = Table(title=f"serve-sim: {res['model']} on {res['topology']} ({res['accelerator']} x "
                    f"{res['ep']}), SLOs: {slo_text(res)}; max req/s [the nearest that misses) and "
                    f"tokens/s under each SLO of the system's attention mode, searched to "
                    f"{res['search']['tolerance']:.0%}")
    for c in ("system", "placement / pipeline / policy", "LAR", *[f"{k} req/s" for k in SLO_KEYS],
              *[f"{k} tok/s" for k in SLO_KEYS]):
        t.add_column(c, justify="right")
    for name, s in res["systems"].items():
        c = s["config"]
        t.add_row(name, f"{c['placement']} / {c['pipeline']} / {c['policy']}", _r(c["lar"], "{:.3f}"),
                  *[_interval(s.get("search", {}).get(k), s["max_rate_under_slo"][k]) for k in SLO_KEYS],
                  *[_r(s["throughput_under_slo"][k], "{:.0f}") for k in SLO_KEYS])
    out.print(t)
    if res.get("compute_model"):
        out.print(f"compute: {res['compute_model']}")
