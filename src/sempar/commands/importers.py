"""`sempar import sglang`: routing recorded by a serving engine, converted into a trace."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import TOKENS_MAX, bound
from sempar.commands._options import json_option
from sempar.console import emit_json

import_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Convert routing recorded by serving engines into traces.")


@import_app.command("sglang")
def import_sglang_cmd(dumps: list[Path] = typer.Argument(..., help="SGLang per_token dump files "
                                                                   "(one .pt per rank)"),
                      out_file: Path = typer.Option(..., "--out", help="Parquet trace to write"),
                      model: Optional[str] = typer.Option(None, "--model",
                                                          help="model name stored in the trace"),
                      num_experts: Optional[int] = typer.Option(None, "--num-experts",
                                                                help="logical experts (default: map max + 1)",
                                                                callback=bound(1, 1_000_000)),
                      top_k: Optional[int] = typer.Option(None, "--top-k",
                                                          help="experts per token (default: slots used)",
                                                          callback=bound(1, 4096)),
                      vocab_size: Optional[int] = typer.Option(None, "--vocab-size",
                                                               help="default: max token id + 1",
                                                               callback=bound(1, TOKENS_MAX)),
                      drop_incomplete: bool = typer.Option(False, "--drop-incomplete",
                                                           help="drop tokens with -1 ids in a MoE "
                                                                "layer instead of failing"),
                      keep_duplicates: bool = typer.Option(False, "--keep-duplicates",
                                                           help="keep attention-TP copies of a pass "
                                                                "recorded by several ranks"),
                      as_json: bool = json_option()) -> None:
    """Convert SGLang expert-distribution dumps (per_token mode) into a routing trace."""
    from sempar.atomic import check_output
    from sempar.progress import progress_bar
    from sempar.trace.sglang import import_sglang

    check_output(out_file, *dumps)
    with progress_bar("import sglang", None) as advance:
        summary = import_sglang(dumps, out_file, model=model, num_experts=num_experts, top_k=top_k,
                                vocab_size=vocab_size,
                                on_incomplete="drop" if drop_incomplete else "error",
                                dedup=not keep_duplicates, progress=advance)
    if as_json:
        emit_json(summary)
    sys.stderr.write(f"wrote {out_file}: {summary['tokens']} tokens, {summary['requests']} requests "
                     f"from {summary['records']} passes of ranks {summary['ranks']}, "
                     f"{summary['layers']} MoE layers x {summary['experts']} experts, "
                     f"top-{summary['top_k']}\n")


def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")
