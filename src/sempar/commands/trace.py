"""`sempar trace validate` and `sempar trace info`: check and summarise a routing trace."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.table import Table

from sempar.commands._options import json_option
from sempar.console import emit_json, out

trace_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Inspect and check routing traces.")


@trace_app.command("validate")
def trace_validate(file: Path = typer.Argument(..., help="Parquet trace to check")) -> None:
    """Check every row and the metadata of a trace; exit 0 if valid, 2 with one line if not."""
    from sempar.trace import trace_info

    info = trace_info(file)
    sys.stderr.write(f"{file}: valid trace: {info['tokens']} tokens, {info['requests']} requests, "
                     f"{info['layers']} layers x {info['experts']} experts, top-{info['top_k']}\n")


@trace_app.command("info")
def trace_info_cmd(file: Path = typer.Argument(..., help="Parquet trace"),
                   as_json: bool = json_option()) -> None:
    """Summarise a trace: tokens, requests, model shape, domains."""
    from sempar.trace import trace_info

    info = trace_info(file)
    if as_json:
        emit_json(info)
        return
    table = Table(title=str(file), show_header=False)
    for key in ("model", "tokens", "requests", "layers", "experts", "top_k", "shared_experts",
                "vocab_size", "has_weights", "has_token_ids"):
        table.add_row(key, str(info[key]))
    for name, n in info["domains"].items():
        table.add_row(f"domain {name}", f"{n} tokens")
    out.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
