"""`sempar analyze`: read a trace, compute the affinity statistics, write JSON, PNGs and a report.

Outputs land in the --out folder only when everything succeeded: the folder is built beside
the target and swapped in by `sempar.atomic.atomic_folder` (same filesystem, so no EXDEV; a
non-empty folder sempar did not write is refused, or moved aside with `force`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import typer

from sempar.atomic import atomic_folder, check_folder_output, write_text_atomic
from sempar.bounds import DEVICES_MAX, TOKENS_MAX, bound
from sempar.commands._options import ep_option, json_option, renamed, seed_option
from sempar.console import emit_json, err, json_text
from sempar.errors import InputError
from sempar.report.analysis import analyze_to


def run_analyze(trace_path: Path | None, out_dir: Path | None, devices: int = 8, seed: int = 0,
                max_tokens: int = 1_000_000, aggregates: Path | None = None,
                quiet: bool = False, control: bool = False, force: bool = False) -> dict:
    """The whole command; returns the JSON printed by --json."""
    if trace_path is None and aggregates is None:
        raise InputError("analyze: give a TRACE file, --olmoe-aggregates DIR, or both")
    if out_dir is not None:
        check_folder_output(out_dir, trace_path, aggregates, force=force)
    if aggregates is not None and not aggregates.is_dir():
        raise InputError(f"--olmoe-aggregates: {aggregates} is not a folder")
    if max_tokens < 8:
        raise InputError(f"--max-tokens: {max_tokens} must be at least 8")
    folder = (atomic_folder(out_dir, "analyze", trace_path, aggregates, force=force)
              if out_dir is not None else contextlib.nullcontext(None))
    with folder as tmp:
        fig_dir = tmp
        result: dict = {}
        plots: dict[str, Path] = {}
        if trace_path is not None:
            result, plots = analyze_to(trace_path, devices, seed, max_tokens, fig_dir, quiet,
                                       control)
        real = real_plots = None
        if aggregates is not None:
            from sempar.affinity.aggregates import analyze_aggregates

            real = analyze_aggregates(aggregates)
            if fig_dir is not None:
                from sempar.report.aggregate_plots import plot_aggregates

                real_plots = plot_aggregates(real, fig_dir)
            if trace_path is None:
                result = real
            else:
                result["real"] = real
        if out_dir is not None:
            from sempar.report.html import HtmlReport
            from sempar.report.sections import add_aggregates, add_analysis

            report = HtmlReport("sempar analyze")
            if trace_path is not None:
                add_analysis(report, result, plots, f"Trace {trace_path.name}")
            if real is not None:
                add_aggregates(report, real, real_plots or [])
            report.write(tmp / "report.html")
            write_text_atomic(tmp / "analysis.json", json_text(result, indent=1) + "\n")
    if not quiet and trace_path is not None:
        from sempar.report.sections import analysis_table

        err.print(analysis_table(result))
    return result



def analyze(trace: Optional[Path] = typer.Argument(None, help="Parquet trace"),
            out_dir: Optional[Path] = typer.Option(None, "--out", help="folder for JSON, PNGs, report"),
            as_json: bool = json_option(),
            ep: Optional[int] = ep_option(None, "G for device-level figures (--devices: the old "
                                          "spelling, still read) \\[default: 8]"),
            devices: Optional[int] = typer.Option(None, "--devices", hidden=True,
                                                  callback=bound(1, DEVICES_MAX)),
            seed: int = seed_option(),
            max_tokens: int = typer.Option(1_000_000, "--max-tokens",
                                           help="analyse a random subset of whole requests above this",
                                           callback=bound(8, TOKENS_MAX)),
            olmoe_aggregates: Optional[Path] = typer.Option(
                None, "--olmoe-aggregates", help="also analyse the real OLMoE/Mixtral aggregates here"),
            control: bool = typer.Option(False, "--control",
                                         help="also analyse a random router of the same shape"),
            force: bool = typer.Option(False, "--force", help="move a non-empty --out folder "
                                       "sempar did not write aside (never deleted)")) -> None:
    """Affinity statistics: Sem-MoE Table 1, kurtosis, inter-layer affinity, domains, load tail."""
    result = run_analyze(trace, out_dir, devices=renamed(ep, devices, "--ep", "--devices", 8),
                         seed=seed, max_tokens=max_tokens, aggregates=olmoe_aggregates,
                         quiet=as_json, control=control, force=force)
    if as_json:
        emit_json(result)


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
