"""`sempar synth`: a synthetic routing trace with the shape of a real MoE model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import TOKENS_MAX, bound
from sempar.commands._options import seed_option
from sempar.model_presets import names as preset_names


def synth(preset: str = typer.Option(..., "--preset",
                                    help="model shape: " + ", ".join(preset_names())),
          tokens: int = typer.Option(..., "--tokens", help="number of tokens",
                                     callback=bound(1, TOKENS_MAX)),
          requests: Optional[int] = typer.Option(None, "--requests",
                                                 help="number of requests (default tokens/256)",
                                                 callback=bound(1, TOKENS_MAX)),
          seed: int = seed_option(),
          weights: bool = typer.Option(False, "--weights/--no-weights",
                                       help="also store router weights"),
          shards: int = typer.Option(1, "--shards", callback=bound(1, 10_000),
                                     help="write the trace as this many files cut at request "
                                          "boundaries (OUT.00.parquet, ...), for `stats build`"),
          out_file: Path = typer.Option(..., "--out", help="Parquet trace to write")) -> None:
    """Generate a synthetic routing trace with the shape of a real MoE model."""
    from sempar.atomic import check_output
    from sempar.progress import progress_bar
    from sempar.trace.synth import SynthGenerator

    from sempar.trace.synth import shard_paths, write_shards

    outs = shard_paths(out_file, shards) if shards > 1 else [out_file]
    for o in outs:
        check_output(o)
    gen = SynthGenerator(preset, tokens, requests, seed, weights=weights)
    if shards > gen.requests:
        from sempar.errors import InputError
        raise InputError(f"--shards: {shards} shards for {gen.requests} requests; at most one "
                         f"shard a request")
    with progress_bar(f"synth {gen.shape.model}", tokens) as advance:
        if shards > 1:
            write_shards(gen, outs, progress=advance)
        else:
            gen.write(out_file, progress=advance)
    where = out_file if shards == 1 else f"{outs[0]} .. {outs[-1].name} ({shards} shards)"
    sys.stderr.write(f"wrote {where}: {tokens} tokens, {gen.requests} requests, "
                     f"{gen.shape.num_layers} layers x {gen.shape.num_experts} experts, "
                     f"top-{gen.shape.top_k}\n")


def register(app: typer.Typer) -> None:
    app.command("synth")(synth)
