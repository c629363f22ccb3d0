"""`sempar drift`: a trace's real requests reordered into a stream whose traffic mix changes."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from sempar.bounds import REQUESTS_MAX, bound
from sempar.commands._names import names_option
from sempar.commands._options import json_option, seed_option
from sempar.errors import InputError


def _orders():
    from sempar.drift.streams import ORDERS

    return ORDERS


def drift(trace: Path = typer.Option(..., "--trace", help="trace with request domains (Parquet)"),
          order: str = names_option("tasks", "--order", _orders, single=True,
                                    help="tasks (domains one after another), groups (MMLU subject "
                                         "groups one after another), mixture (the mix switches "
                                         "every --switch-every requests)"),
          switch_every: int = typer.Option(16, "--switch-every", callback=bound(1, REQUESTS_MAX),
                                           help="mixture: requests per segment (K)"),
          mix: float = typer.Option(0.8, "--mix", callback=bound(0.0, 1.0),
                                    help="mixture: share of a segment from its main domain"),
          seed: int = seed_option(),
          out_file: Path = typer.Option(..., "--out", help="stream trace to write (Parquet)"),
          as_json: bool = json_option()) -> None:
    """Reorder a trace's requests into a drift stream (the input of `sempar replay`)."""
    from sempar.atomic import check_output
    from sempar.console import emit_json
    from sempar.drift.streams import drift_stream, phases
    from sempar.trace import read_trace
    from sempar.trace.io import write_trace

    check_output(out_file, trace)
    source = read_trace(trace)
    if order == "groups":               # else it would silently be --order tasks
        from sempar.drift.streams import GROUPS

        other = [d for d in source.domains if d.replace(" ", "_") not in GROUPS]
        if other or not source.domains:
            raise InputError(f"--order groups: the trace's domains are not MMLU subjects "
                             f"({other[0] if other else 'none'!r}); use --order tasks")
    stream = drift_stream(source, order, switch_every, mix, seed)
    write_trace(stream, out_file)
    ph = phases(stream)
    sys.stderr.write(f"wrote {out_file}: {stream.num_requests} requests, {len(ph)} phases "
                     f"({', '.join(f'{n}@{r}' for r, n in ph[:8])}{', ...' if len(ph) > 8 else ''})\n")
    if as_json:
        emit_json({"path": str(out_file), "order": order, "requests": stream.num_requests,
                   "tokens": stream.num_tokens,
                   "phases": [{"first_request": r, "domain": n} for r, n in ph]})


def register(app: typer.Typer) -> None:
    app.command("drift")(drift)
