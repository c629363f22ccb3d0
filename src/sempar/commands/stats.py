"""`sempar stats build`, `sempar stats merge`, `sempar stats info`: mergeable routing statistics
of trace shards (stats/routing_stats.py), built here or as Ray tasks, for `place --stats`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from sempar.bounds import TOKENS_MAX, bound
from sempar.commands._options import json_option, seed_option
from sempar.console import emit_json, out
from sempar.errors import InputError

stats_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Mergeable routing statistics of trace shards (for place --stats).")

SHARDS_MAX = 100_000      # files on one command line: each is opened and its header checked


def _parts(value: Optional[str]) -> Optional[str]:
    from sempar.stats.parts import STATS_PARTS
    from sempar.commands._names import check_names

    check_names("--parts", value, STATS_PARTS)
    return value


def _parts_help() -> str:
    from sempar.stats.parts import DEFAULT_PARTS, STATS_PARTS

    items = "; ".join(f"{n}: {STATS_PARTS.get(n).holds}" for n in STATS_PARTS.names())
    return (f"comma-separated parts beside loads and request sizes (default "
            f"{','.join(DEFAULT_PARTS)}; those needing token ids are skipped on traces "
            f"without): {items}")


def _check_ray(value: Optional[str]) -> Optional[str]:
    from sempar.ray_cluster import check_address

    return check_address(value)


def _check_token_parts(chosen: tuple[str, ...], traces: List[Path]) -> None:
    """An explicit --parts naming a part that needs token ids is refused on a trace without
    them (the default set drops such parts quietly: nothing was asked for by name)."""
    from sempar.stats.parts import STATS_PARTS
    from sempar.trace.io import read_header

    needs = [p for p in chosen if STATS_PARTS.get(p).needs_token_ids]
    for t in traces if needs else ():
        if not read_header(t)[2].has_token_ids:
            raise InputError(f"--parts {needs[0]}: {t} has no token ids (imported without "
                             f"them); leave {needs[0]} out of --parts")


@stats_app.command("build")
def stats_build(traces: List[Path] = typer.Option(..., "--trace",
                                                  help="trace shard (Parquet); repeat, in order"),
                out_file: Path = typer.Option(..., "--out", help="stats file to write"),
                parts: Optional[str] = typer.Option(None, "--parts", callback=_parts,
                                                    help=_parts_help()),
                seed: int = seed_option("seed of the request sample (place --stats needs the "
                                        "same --seed)"),
                sample_rows: int = typer.Option(200_000, "--sample-rows",
                                                callback=bound(1, TOKENS_MAX),
                                                help="row budget of the request sample"),
                token_cells: int = typer.Option(None, "--token-cells",
                                                callback=bound(0, TOKENS_MAX),
                                                help="cap on each layer's token table, in "
                                                     "(token, expert) cells: a Misra-Gries "
                                                     "summary whose counts read low by at most "
                                                     "k x rows / (cap + 1), the exact bound "
                                                     "stored (0: exact, no cap; default "
                                                     "stats.sketch.TOKEN_CELLS)"),
                ray: Optional[str] = typer.Option(None, "--ray", callback=_check_ray,
                                                  help="build the shards as Ray tasks: local (a "
                                                       "local cluster), auto (the running one) "
                                                       "or an address; default: no Ray"),
                ray_timeout: float = typer.Option(30.0, "--ray-timeout",
                                                  callback=bound(0.1, 3600.0),
                                                  help="seconds to reach the --ray cluster"),
                jobs: int = typer.Option(1, "--jobs", callback=bound(1, 4096),
                                         help="shards built at once (processes or Ray CPUs)"),
                as_json: bool = json_option("print the stats' summary as one JSON object")
                ) -> None:
    """Build the statistics of trace shards (their concatenation, in order) and write them."""
    from sempar.stats.parts import DEFAULT_PARTS
    from sempar.stats.file import save_stats
    from sempar.stats.run import StatsSettings, build_stats, small_pages
    from sempar.stats.sketch import TOKEN_CELLS
    from sempar.atomic import check_output
    from sempar.progress import progress_bar

    if len(traces) > SHARDS_MAX:
        raise InputError(f"--trace: {len(traces)} shards; at most {SHARDS_MAX}")
    check_output(out_file, *traces)
    chosen = tuple(p.strip() for p in parts.split(",") if p.strip()) if parts else DEFAULT_PARTS
    if parts:
        _check_token_parts(chosen, traces)
    settings = StatsSettings(parts=chosen, seed=seed, sample_rows=sample_rows,
                             token_cells=TOKEN_CELLS if token_cells is None else token_cells)
    runner = "local" if ray is None else "ray"
    with progress_bar(f"stats of {len(traces)} shard(s)", len(traces)) as advance:
        stats = build_stats([str(t) for t in traces], settings, runner=runner, jobs=jobs,
                            ray_address=ray, progress=advance, ray_timeout=ray_timeout)
    with small_pages():
        save_stats(stats, out_file)
    _report(stats, out_file, as_json)


@stats_app.command("merge")
def stats_merge(inputs: List[Path] = typer.Option(..., "--stats",
                                                  help="stats file; repeat, in shard order"),
                out_file: Path = typer.Option(..., "--out", help="merged stats file to write"),
                as_json: bool = json_option("print the stats' summary as one JSON object")
                ) -> None:
    """Merge stats files (of consecutive shards, in order) into one."""
    from sempar.stats.routing_stats import merge_all
    from sempar.stats.file import load_stats, save_stats
    from sempar.atomic import check_output

    if len(inputs) > SHARDS_MAX:
        raise InputError(f"--stats: {len(inputs)} files; at most {SHARDS_MAX}")
    check_output(out_file, *inputs)
    stats = merge_all([load_stats(p) for p in inputs], [str(p) for p in inputs])
    save_stats(stats, out_file)
    _report(stats, out_file, as_json)


@stats_app.command("info")
def stats_info(file: Path = typer.Argument(..., help="stats file"),
               as_json: bool = json_option()) -> None:
    """Summarise a stats file: model, rows, requests, parts, sample, shards."""
    from sempar.stats.file import load_stats

    _report(load_stats(file), None, as_json)


def _report(stats, written: Optional[Path], as_json: bool) -> None:
    info = {"model": stats.meta.model, "rows": stats.rows, "requests": int(stats.request_ids.size),
            "layers": stats.meta.num_layers, "experts": stats.meta.num_experts,
            "top_k": stats.meta.top_k, "parts": list(stats.parts), "seed": stats.seed,
            "sample_rows": None if stats.sample is None else int(stats.sample["row"].size),
            "shards": [{"name": n, "rows": r} for n, r in stats.shards]}
    if stats.tokens is not None:
        info["token_cells"] = int(stats.token_cells)
        info["token_table_cells"] = int(sum(t.nnz for t in stats.tokens))
        info["token_error_max"] = int(stats.token_error.max(initial=0))
    if as_json:
        emit_json(info)
    else:
        out.print(f"{stats.meta.model}: {info['rows']} rows, {info['requests']} requests in "
                  f"{len(stats.shards)} shard(s); parts {', '.join(stats.parts) or '(none)'}; "
                  f"sample {info['sample_rows']} rows (seed {stats.seed})"
                  + (f"; token tables {info['token_table_cells']} cells (cap "
                     f"{info['token_cells'] or 'none'} a layer, counts low by <= "
                     f"{info['token_error_max']})" if stats.tokens is not None else ""),
                  markup=False)
    if written is not None:
        sys.stderr.write(f"wrote {written}\n")


def register(app: typer.Typer) -> None:
    app.add_typer(stats_app, name="stats")
