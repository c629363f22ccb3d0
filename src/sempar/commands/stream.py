"""`sempar stream`: the FSE-DP multi-chiplet simulator (sempar.chiplet) on a routing trace."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import MICRO_SLICES_MAX, bound
from sempar.commands._names import WithAliases, names_option
from sempar.commands._options import json_option, seed_option
from sempar.console import emit_json


def _strategies() -> WithAliases:
    from sempar.chiplet.strategies import ALIASES, STRATEGIES

    return WithAliases(STRATEGIES, ALIASES)


_POSITIVE = bound(0, 1e6, lo_open=True)     # buffer MiB, GB/s: far beyond any package


def register(app: typer.Typer) -> None:
    app.command("stream")(stream)


def stream(
    ctx: typer.Context,
    model: str = typer.Option("qwen3-30b-a3b", help="model shape of FSE-DP Table I: phi-3.5-moe, yuan2.0-m32, deepseek-moe-16b, qwen3-30b-a3b"),
    trace: Optional[Path] = typer.Option(None, help="routing trace (Parquet); default a synthetic trace of the model"),
    tokens_per_iter: int = typer.Option(64, help="input tokens per iteration (paper: 16, 64, 256, 1024)",
                                        callback=bound(1, 1_000_000)),
    iterations: int = typer.Option(100, help="forward iterations (paper: 100)",
                                   callback=bound(1, 100_000)),
    strategy: str = names_option("all", "--strategy", _strategies, words=("all",),
                                 help="'all' or comma-separated: ep, ep-db, hydra, hydra-db, "
                                 "fsedp-naive, fsedp, fsedp+paired-load, ..."),
    mesh: str = typer.Option("2x2", help="die mesh ROWSxCOLS"),
    buffer_mb: float = typer.Option(16.0, help="on-chip expert buffer per die (MiB)", callback=_POSITIVE),
    ddr_gbps: float = typer.Option(25.6, help="DDR bandwidth per die (GB/s)", callback=_POSITIVE),
    d2d_gbps: float = typer.Option(288.0, help="D2D bandwidth per mesh link (GB/s)", callback=_POSITIVE),
    precision: str = typer.Option("int8", help="weight precision: fp32, bf16, fp16, int8, fp8, int4"),
    micro_slices: int = typer.Option(0, help="micro-slices per expert, FSE-DP strategies only (0: "
                                     "8, more when the buffer holds fewer than 8; iterations x "
                                     "micro-slices^3 is bounded: bounds.MICRO_SLICE_WORK_MAX)",
                                     callback=bound(0, MICRO_SLICES_MAX)),
    sweeps: bool = typer.Option(False, "--sweeps", help="also run the design-space sweeps (Figs. 16-18)"),
    sweep_iterations: int = typer.Option(3, help="iterations per sweep point (each sweep runs 89 points)",
                                         callback=bound(1, 100)),
    seed: int = seed_option("seed of the synthetic trace"),
    plot: Optional[Path] = typer.Option(None, help="write the figures into this folder"),
    json_out: bool = json_option(),
) -> None:
    """Compare EP, Hydra (as the paper runs them, and double-buffered) and the FSE-DP variants on a multi-chiplet package."""
    from sempar.chiplet import sweeps as sw
    from sempar.chiplet.hardware import MB, ChipletConfig, area_mm2, feasible, parse_mesh, power_w
    from sempar.chiplet.flow import auto_micro_slices, micro_slice_slots
    from sempar.chiplet.models import MODELS, precision_bytes
    from sempar.chiplet.simulate import simulate
    from sempar.chiplet.strategies import resolve
    from sempar.chiplet.workload import load_workload
    from sempar.errors import InputError
    from sempar.progress import progress_bar, steps

    from sempar.bounds import check_bound, check_micro_slice_work
    from sempar.commands._options import refuse_unused

    rows, cols = parse_mesh(mesh)
    strategies = resolve(strategy)
    refuse_unused(ctx, {"micro_slices": "micro_slices"},
                  lambda knob: any(knob in s.knobs for s in strategies), f"--strategy {strategy}")
    check_bound("--tokens-per-iter x --iterations", tokens_per_iter * iterations, 1, 50_000_000)
    if trace is not None and not Path(trace).exists():
        raise InputError(f"--trace: {trace} does not exist")
    if plot is not None:
        from sempar.atomic import check_output

        check_output(plot, trace, option="--plot", folder=True)
    cfg = ChipletConfig(rows=rows, cols=cols, buffer_bytes=int(buffer_mb * MB), ddr_bw_per_die=ddr_gbps * 1e9,
                        d2d_bw=d2d_gbps * 1e9)
    wb = precision_bytes(precision)
    m = MODELS.get(model)
    micro_slices = micro_slices or auto_micro_slices(cfg, m.expert_params * wb)
    if any(s.kind == "flow" for s in strategies):
        micro_slice_slots(cfg, m.expert_params * wb, micro_slices)
        check_micro_slice_work(iterations, micro_slices, "--iterations")
        if sweeps:
            check_micro_slice_work(sweep_iterations, max(micro_slices, 32), "--sweep-iterations")
    m, wl = load_workload(model, trace, tokens_per_iter, iterations, seed)
    with steps("stream", len(strategies)) as step:
        results = simulate(wl, cfg, strategies, precision, micro_slices, progress=step)
    sweep_out = None
    if sweeps:
        short = dataclasses.replace(wl, iterations=wl.iterations[:sweep_iterations])
        total = sum(sw.points(k) for k in ("buffer_x_ddr", "ddr_x_d2d", "microslice_x_buffer", "scaling"))
        with progress_bar("sweeps", total) as advance:
            sweep_out = {"buffer_x_ddr": sw.buffer_x_ddr(short, cfg, precision, micro_slices, tick=advance),
                         "ddr_x_d2d": sw.ddr_x_d2d(short, cfg, precision, micro_slices, tick=advance),
                         "microslice_x_buffer": sw.microslice_x_buffer(short, cfg, precision, tick=advance),
                         "scaling": sw.scaling(short, cfg, precision, micro_slices, tick=advance)}
    written = []
    if plot is not None:
        from sempar.chiplet.plots import write_plots
        written = write_plots(plot, results, sweep_out, f"{m.name}, {tokens_per_iter} tokens/iter")
    base = results.get("ep")
    out = {"model": m.name, "tokens_per_iter": tokens_per_iter, "iterations": iterations,
           "trace": wl.source, "trace_wrapped": wl.wrapped, "precision": precision,
           "micro_slices": micro_slices,
           "hardware": {"mesh": f"{rows}x{cols}", "buffer_bytes_per_die": cfg.buffer_bytes,
                        "ddr_bw_per_die": cfg.ddr_bw_per_die, "d2d_bw": cfg.d2d_bw,
                        "area_mm2_per_die": area_mm2(cfg), "power_w": power_w(cfg),
                        "within_limits": feasible(cfg)},
           "strategies": {n: {**r.to_json(),
                              **({"speedup_vs_ep": base.layer_latency_s / r.layer_latency_s} if base else {})}
                          for n, r in results.items()}}
    if sweep_out:
        out["sweeps"] = sweep_out
    if plot is not None:
        out["plots"] = written
    if json_out:
        emit_json(out)
        return
    from rich.table import Table
    t = Table(title=f"sempar stream: {m.name}, {tokens_per_iter} tokens/iter, {iterations} iterations, {rows}x{cols}")
    for c in ("strategy", "layer latency (us)", "speedup vs EP", "e2e latency (s)", "utilization", "peak on-chip (MiB)"):
        t.add_column(c, justify="right" if c != "strategy" else "left")
    for n, r in results.items():
        sp = f"{base.layer_latency_s / r.layer_latency_s:.2f}x" if base else "-"
        t.add_row(n, f"{r.layer_latency_s * 1e6:.1f}", sp, f"{r.e2e_latency_s:.3f}", f"{r.utilization:.3f}",
                  f"{r.peak_bytes / MB:.1f}")
    from sempar.console import SafeConsole

    SafeConsole(width=140).print(t)
    for p in written:
        typer.echo(f"wrote {p}")
