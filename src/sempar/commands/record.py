"""`sempar record`: run texts through a HF MoE model and record the experts of every MoE layer."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from sempar.bounds import bound
from sempar.commands._options import json_option
from sempar.console import emit_json


def record_cmd(model: str = typer.Option(..., "--model",
                                         help="packaged model name (tiny-moe64, tiny-mixtral) or a "
                                              "model folder (config.json + safetensors)"),
               texts: list[str] = typer.Option(..., "--text",
                                               help="FILE[:DOMAIN], repeatable; the domain defaults "
                                                    "to the file stem"),
               out_file: Path = typer.Option(..., "--out", help="Parquet trace to write"),
               max_tokens: int = typer.Option(512, "--max-tokens",
                                              help="truncate every request to this many tokens",
                                              callback=bound(1, 1_000_000)),
               batch_size: int = typer.Option(8, "--batch-size", help="requests per forward pass",
                                              callback=bound(1, 65536)),
               dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16"),
               weights: bool = typer.Option(True, "--weights/--no-weights",
                                            help="store router weights too"),
               as_json: bool = json_option()) -> None:
    """Run texts through a HF MoE model and record the exact experts of every MoE layer."""
    from sempar.atomic import check_output
    from sempar.progress import progress_bar
    from sempar.trace.record import RecordJob

    job = RecordJob.prepare(model, texts, max_tokens=max_tokens, dtype=dtype, out=out_file)
    check_output(out_file)      # again: the model's own files are registered inputs by now
    with progress_bar(f"record {job.source.name}", job.total_tokens) as advance:
        summary = job.run(out_file, batch_size=batch_size, progress=advance, weights=weights)
    if as_json:
        emit_json(summary)
    sys.stderr.write(f"wrote {out_file}: {summary['tokens']} tokens, {summary['requests']} requests, "
                     f"{summary['layers']} MoE layers x {summary['experts']} experts, "
                     f"top-{summary['top_k']}\n")


def register(app: typer.Typer) -> None:
    app.command("record")(record_cmd)
