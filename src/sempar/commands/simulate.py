"""`sempar simulate`: bytes per directed pair and all-to-all time of a pipeline on a topology
(docs/design.md, comm/; CAMoE eq. 9). See sempar.comm for the model and its choices."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import bound
from sempar.console import emit_json, out
from sempar.commands._names import names_option, pipelines, request_policies
from sempar.commands._options import (COLLECTIVES_HELP, given, json_option, nodes_option,
                                      refuse_unused, seed_option)
from sempar.commands._options import collectives as check_collectives
from sempar.errors import InputError


def _list(s: str) -> list[str]:
    out = [x.strip() for x in s.split(",") if x.strip()]
    if not out:
        raise InputError(f"empty list: {s!r}")
    return out


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate_cmd(
        ctx: typer.Context,
        trace: Path = typer.Option(..., "--trace", help="routing trace (Parquet); split by request, "
                                   "20% fit (solvers, schedulers), 80% simulated"),
        placement: str = typer.Option("vanilla", "--placement",
                                      help="placement JSON or a method name solved on the fit split "
                                      "(--compare: comma-separated list, the first is the baseline)"),
        pipeline: str = names_option("sglang-ep", "--pipeline", pipelines,
                                     help="pipeline (smoe = semmoe-tp; --compare: a list)"),
        topology: str = typer.Option("pcie-upi8", "--topology", help="preset (nvlink8, pcie-upi8, "
                                     "a100x4-ib[:N], hetero-cloud[:N]) or topology JSON (--compare: list)"),
        nodes: Optional[int] = nodes_option(None, "nodes of a scalable preset"),
        hidden: Optional[int] = typer.Option(None, "--hidden", help="hidden size (default: the "
                                             "trace's model: tiny models' config, preset table)",
                                             callback=bound(1, 1_000_000)),
        dtype_bytes: int = typer.Option(2, "--dtype-bytes", help="bytes per element (bf16 = 2)",
                                        callback=bound(1, 16)),
        batch: int = typer.Option(2048, "--batch", help="tokens per batch", callback=bound(1, 10_000_000)),
        schedule: str = typer.Option("auto", "--schedule", help="auto: online schedulers when the "
                                     "placement has a token table (co-clustering methods); online: "
                                     "always; none: vanilla homes"),
        policy: str = names_option("alg2", "--policy", request_policies, single=True,
                                   help="request policy for attention-DP homes (DP pipelines)"),
        dedup: Optional[bool] = typer.Option(None, "--dedup/--no-dedup",
                                             help="override the pipeline's de-duplication"),
        one_shot: Optional[bool] = typer.Option(None, "--one-shot/--separate-metadata",
                                                help="override the pipeline's metadata mode"),
        count_sag: bool = typer.Option(True, "--count-sag/--no-count-sag",
                                       help="smoe: count the closing shuffled all-gather"),
        logit_bytes: int = typer.Option(4, "--logit-bytes", help="smoe-exact: bytes per "
                                        "all-reduced router logit (fp32 = 4, bf16 = 2)",
                                        callback=bound(1, 16)),
        seed: int = seed_option("split and solver seed"),
        collectives: Optional[str] = typer.Option(None, "--collectives", help=COLLECTIVES_HELP,
                                                  callback=check_collectives),
        compare: bool = typer.Option(False, "--compare", help="every placement x pipeline x "
                                     "topology in one table and one PNG"),
        png: Optional[Path] = typer.Option(None, "--png", help="--compare: plot path (default: "
                                           "simulate-compare.png; with --json none unless given)"),
        as_json: bool = json_option(),
    ) -> None:
        """Bytes per directed pair and all-to-all time (CAMoE eq. 9) per layer and in total."""
        from sempar.comm.compare import Study, plot_grid, run_grid, single
        from sempar.comm.simulate import SimOptions, resolve_hidden
        from sempar.comm.topology_presets import load_topology
        from sempar.progress import steps
        from sempar.comm.pipelines import PIPELINES
        from sempar.trace import read_trace

        pipes = _list(pipeline) if compare else [pipeline]
        if not compare and len(_list(pipeline)) > 1:
            raise InputError(f"--pipeline: {pipeline!r} names several; give --compare for a list")
        # options some pipelines do not take (their registered knobs): refused, not ignored
        refuse_unused(ctx, {k: k for k in ("dedup", "one_shot", "schedule", "policy", "count_sag",
                                           "logit_bytes")},
                      lambda knob: any(knob in PIPELINES.get(p).knobs for p in pipes),
                      f"--pipeline {pipeline}")
        if given(ctx, "policy") and schedule == "none":
            raise InputError("--policy: does not apply with --schedule none (vanilla homes)")
        from sempar.placement import SOLVERS

        for m in _list(placement):      # a method name or a placement JSON: known before work
            if m not in SOLVERS and not Path(m).exists():
                raise InputError(f"--placement: {m!r} is neither a placement method "
                                 f"({', '.join(SOLVERS.names())}) nor a file")
        topos = [load_topology(t, nodes) for t in (_list(topology) if compare else [topology])]
        if compare and png is None and not as_json:
            png = Path("simulate-compare.png")      # the table's plot; --json writes none unasked
        if compare and png is not None:
            from sempar.atomic import check_output

            files = [f for f in _list(placement) + _list(topology) if Path(f).exists()]
            check_output(png, trace, *files, option="--png")
        tr = read_trace(trace)
        opts = SimOptions(hidden=resolve_hidden(tr.meta.model, tr.meta.extra, hidden),
                          dtype_bytes=dtype_bytes, batch=batch, dedup=dedup, one_shot=one_shot,
                          count_sag=count_sag, logit_bytes=logit_bytes, collectives=collectives)
        study = Study.from_trace(tr, opts, schedule=schedule, policy=policy, seed=seed)
        if compare:
            methods, pipes, topos = _list(placement), _list(pipeline), _list(topology)
            with steps("simulate", len(methods) * len(pipes) * len(topos)) as step:
                rows = run_grid(study, methods, pipes, topos, nodes, progress=step)
            if png is not None:
                plot_grid(rows, png, title=f"{tr.meta.model}: {', '.join(topos)}")
            if as_json:
                emit_json({"trace": str(trace), "hidden": opts.hidden, "batch": opts.batch,
                           "png": None if png is None else str(png), "rows": rows})
            else:
                _print_rows(rows)
                sys.stderr.write(f"wrote {png}\n")
            return
        res = single(study, placement, pipeline, topos[0])
        if as_json:
            emit_json(res)
            return
        _print_single(res)


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def _f(x, fmt="{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _print_single(res: dict) -> None:
    from rich.table import Table

    t = Table(title=f"{res['pipeline']} on {res['topology']} ({res['devices']} devices, "
                    f"{res['nodes']} nodes), placement {res.get('placement')}, "
                    f"{res['total']['tokens']} tokens in {res['total']['batches']} batches; MB over all batches, "
                    f"ms per batch (mean; total: summed over layers)")
    for c in ("layer", "MB", "a2a ms", "a2a p95 ms", "comm ms", "LAR", "remote copies"):
        t.add_column(c, justify="right")
    for L in res["layers"]:
        t.add_row(str(L["layer"]), f"{L['bytes'] / 1e6:.1f}", _ms(L["a2a_seconds"]),
                  _ms(L["a2a_seconds_p95"]), _ms(L["comm_seconds"]), _f(L["lar"]),
                  _f(L["remote_copies_per_token"]))
    tot = res["total"]
    t.add_row("total", f"{tot['bytes'] / 1e6:.1f}", _ms(tot["a2a_seconds_mean"]),
              _ms(tot["a2a_seconds_p95"]), _ms(tot["comm_seconds_mean"]), _f(tot["lar_mean"]),
              _f(tot["remote_copies_per_token"]))
    out.print(t)


def _print_rows(rows: list[dict]) -> None:
    from rich.table import Table

    t = Table(title="sempar simulate --compare (ratios against the first placement)")
    for c in ("topology", "pipeline", "placement", "sched", "B/token", "a2a ms", "a2a p95",
              "comm ms", "LAR", "copies", "a2a x", "comm x", "bytes x"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(r["topology"], r["pipeline"], r["method"],
                  "-" if r["scheduled"] is None else ("yes" if r["scheduled"] else "no"),
                  f"{r['bytes_per_token']:.0f}", _ms(r["a2a_seconds_mean"]),
                  _ms(r["a2a_seconds_p95"]), _ms(r["comm_seconds_mean"]), _f(r["lar_mean"]),
                  _f(r["remote_copies_per_token"], "{:.2f}"), _f(r["a2a_speedup"], "{:.2f}"),
                  _f(r["comm_speedup"], "{:.2f}"), _f(r["bytes_ratio"], "{:.2f}"))
    out.print(t)
