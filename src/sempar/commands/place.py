"""`sempar place`: solve an expert placement on a fit trace and write placement.json."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import REDUNDANT_MAX, bound
from sempar.errors import InputError
from sempar.commands._options import (ep_option, held_out_option, names_option, nodes_option,
                                      objective_option, seed_option, solvers)


def place(trace: Optional[Path] = typer.Option(None, "--trace", help="fit trace (Parquet)"),
          stats_file: Optional[Path] = typer.Option(
              None, "--stats", help="fit statistics (`sempar stats build`) instead of --trace: "
                                    "sempar's rows objective, the placement --trace would give"),
          method: str = names_option("sempar", "--method", solvers, single=True,
                                     help="placement method (see `evaluate`)"),
          ep: int = ep_option(..., "EP degree G (devices)"),
          nodes: int = nodes_option(1, "nodes the devices are grouped into"),
          redundant: int = typer.Option(0, "--redundant", help="replica slots per layer",
                                       callback=bound(0, REDUNDANT_MAX)),
          mode: str = typer.Option("tp", "--mode", help="mode the placement serves: dp or tp"),
          max_imbalance: float = typer.Option(1.05, "--max-imbalance",
                                              help="per-layer device load cap, x the mean",
                                              callback=bound(1.0, 100.0)),
          preserve_groups: bool = typer.Option(False, "--preserve-groups",
                                               help="experts stay in their expert group's slots"),
          seed: int = seed_option(),
          fit_fraction: Optional[float] = typer.Option(
              None, "--fit-fraction", callback=bound(0.0, 1.0, lo_open=True, hi_open=True),
              help="solve on a seeded (--seed) random fraction of the trace's requests: the "
                   "split serve-sim and plan fit on (their commands pass 0.2)"),
          objective: str = objective_option(),
          held_out_imbalance: float = held_out_option(),
          jobs: Optional[int] = typer.Option(None, "--jobs", callback=bound(1, 4096),
                                             help="worker processes (default: usable CPUs)"),
          out_file: Path = typer.Option(..., "--out", help="placement.json to write")) -> None:
    """Solve an expert placement on a fit trace and write it as JSON."""
    from sempar.atomic import check_output
    from sempar.placement import solve
    from sempar.trace import read_trace

    if (trace is None) == (stats_file is None):
        raise InputError("place: give one of --trace or --stats")
    check_output(out_file, trace if stats_file is None else stats_file)
    if stats_file is not None:
        _place_from_stats(stats_file, out_file, method=method, ep=ep, nodes=nodes,
                          redundant=redundant, mode=mode, max_imbalance=max_imbalance,
                          preserve_groups=preserve_groups, seed=seed, fit_fraction=fit_fraction,
                          objective=objective, held_out_imbalance=held_out_imbalance, jobs=jobs)
        return
    fit = read_trace(trace, optional=("domain",))
    if fit_fraction is not None:
        from sempar.trace.ops import split_by_request

        fit = split_by_request(fit, fit_fraction, seed=seed)[0]
    p = solve(method, fit, num_devices=ep, num_nodes=nodes,
              redundant=redundant, seed=seed, mode=mode, max_imbalance=max_imbalance,
              preserve_groups=preserve_groups, jobs=jobs, objective=objective,
              held_out_imbalance=held_out_imbalance)
    p.save(out_file)
    sys.stderr.write(f"wrote {out_file}: {method}, {p.num_layers} layers, {ep} devices x "
                     f"{p.slots_per_device} slots, {p.num_nodes} node(s)\n")


def _place_from_stats(stats_file: Path, out_file: Path, *, method: str, ep: int, nodes: int,
                      fit_fraction: Optional[float], objective: str, **options) -> None:
    """`place --stats`: placement/from_stats.py, its refusals checked before the solve."""
    from sempar.affinity.summary_file import load_stats
    from sempar.placement.from_stats import check_stats_solve, solve_from_stats

    if fit_fraction is not None:
        raise InputError("--fit-fraction: does not apply to --stats (split the shards instead)")
    stats = load_stats(stats_file)
    check_stats_solve(stats, method, options["seed"], nodes, objective)
    p = solve_from_stats(stats, num_devices=ep, **options)
    p.save(out_file)
    sys.stderr.write(f"wrote {out_file}: {method} from statistics of {stats.rows} rows, "
                     f"{p.num_layers} layers, {ep} devices x {p.slots_per_device} slots\n")


def register(app: typer.Typer) -> None:
    app.command("place")(place)
