"""`sempar place`: solve an expert placement on a fit trace and write placement.json."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import bound
from sempar.errors import InputError
from sempar.commands._names import dispatch_option, names_option, solvers
from sempar.commands._options import (effort_option, ep_option, held_out_option, homes_option,
                                      jobs_option, max_imbalance_option, mode_option, nodes_option,
                                      objective_option, preserve_groups_option, redundant_option,
                                      seed_option, solve_options)


def place(ctx: typer.Context,
          trace: Optional[Path] = typer.Option(None, "--trace", help="fit trace (Parquet)"),
          stats_file: Optional[Path] = typer.Option(
              None, "--stats", help="fit statistics (`sempar stats build`) instead of --trace: "
                                    "sempar's rows objective, the placement --trace would give"),
          method: str = names_option("sempar", "--method", solvers, single=True,
                                     help="placement method (see `evaluate`)"),
          ep: int = ep_option(..., "EP degree G (devices)"),
          nodes: int = nodes_option(1, "nodes the devices are grouped into"),
          redundant: int = redundant_option(),
          mode: str = mode_option(),
          max_imbalance: float = max_imbalance_option(),
          preserve_groups: bool = preserve_groups_option(),
          seed: int = seed_option(),
          fit_fraction: Optional[float] = typer.Option(
              None, "--fit-fraction", callback=bound(0.0, 1.0, lo_open=True, hi_open=True),
              help="solve on a seeded (--seed) random fraction of the trace's requests: the "
                   "split serve-sim and plan fit on (their commands pass 0.2)"),
          homes: str = homes_option(),
          objective: str = objective_option(),
          held_out_imbalance: float = held_out_option(),
          jobs: Optional[int] = jobs_option(),
          effort: float = effort_option(),
          dispatch: str = dispatch_option(),
          ray: Optional[str] = typer.Option(
              None, "--ray", help="with --stats: the per-layer solves as Ray tasks on a local "
                                  "cluster (local, --jobs CPUs), the running one (auto) or an "
                                  "address; the same placement; default: no Ray"),
          ray_timeout: float = typer.Option(30.0, "--ray-timeout", callback=bound(0.1, 3600.0),
                                            help="seconds to reach the --ray cluster"),
          out_file: Path = typer.Option(..., "--out", help="placement.json to write")) -> None:
    """Solve an expert placement on a fit trace and write it as JSON."""
    from sempar.atomic import check_output
    from sempar.placement import solve
    from sempar.ray_cluster import check_address
    from sempar.trace import read_trace

    options = solve_options(ctx)               # checked before any file is read
    if (trace is None) == (stats_file is None):
        raise InputError("place: give one of --trace or --stats")
    if ray is not None and (stats_file is None or not ray.strip()):
        raise InputError("--ray: give local, auto or a cluster address, with --stats")
    check_address(ray)
    check_output(out_file, trace if stats_file is None else stats_file)
    if stats_file is not None:
        _place_from_stats(stats_file, out_file, method, ep, fit_fraction, options, ray,
                          ray_timeout)
        return
    fit = read_trace(trace, optional=("domain",))
    if fit_fraction is not None:
        from sempar.trace.ops import split_by_request

        fit = split_by_request(fit, fit_fraction, seed=seed)[0]
    p = solve(method, fit, num_devices=ep, options=options)
    if p.redundant or dispatch != "nearest":      # part of the placement: export's flags
        p.info["dispatch"] = dispatch
    p.save(out_file)
    sys.stderr.write(f"wrote {out_file}: {method}, {p.num_layers} layers, {ep} devices x "
                     f"{p.slots_per_device} slots, {p.num_nodes} node(s)\n")
    held = p.info.get("held_out")
    if isinstance(held, dict):        # the JSON field: the placement's info.held_out
        sys.stderr.write(f"held-out imbalance: predicted {held['predicted_imbalance']:.3f} "
                         f"(target {held['target']:.2f}, fit cap {held['fit_cap']:.3f})\n")
        if not held.get("within_budget", True):
            sys.stderr.write(f"warning: {held.get('warning', 'not within budget')}\n")


def _place_from_stats(stats_file: Path, out_file: Path, method: str, ep: int,
                      fit_fraction: Optional[float], options, ray: Optional[str] = None,
                      ray_timeout: float = 30.0) -> None:
    """`place --stats`: placement/from_stats.py, its refusals checked before the solve."""
    from sempar.stats.file import load_stats
    from sempar.placement.from_stats import check_stats_solve, solve_from_stats

    if fit_fraction is not None:
        raise InputError("--fit-fraction: does not apply to --stats (split the shards instead)")
    stats = load_stats(stats_file)
    check_stats_solve(stats, method, options)
    if ray is None:
        p = solve_from_stats(stats, num_devices=ep, options=options)
    else:
        from sempar.placement.sempar._pool import usable_cpus
        from sempar.placement.sempar.ray_layers import RayLayers
        from sempar.ray_cluster import ray_session

        with ray_session(ray, options.jobs or usable_cpus(), ray_timeout) as session:
            p = solve_from_stats(stats, num_devices=ep, options=options,
                                 mapper=RayLayers(session))
    p.save(out_file)
    sys.stderr.write(f"wrote {out_file}: {method} from statistics of {stats.rows} rows, "
                     f"{p.num_layers} layers, {ep} devices x {p.slots_per_device} slots\n")


def register(app: typer.Typer) -> None:
    app.command("place")(place)
