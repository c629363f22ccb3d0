"""`sempar export`: a placement as an engine's file (plus its launch flags) or a permuted checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from sempar.bounds import LAYERS_MAX, bound
from sempar.commands._names import export_targets, names_option
from sempar.commands._options import json_option
from sempar.console import emit_json
from sempar.errors import InputError


def export(placement: Path = typer.Option(..., "--placement", help="placement.json"),
           to: str = names_option(..., "--to", export_targets, words=("hf-checkpoint",),
                                  single=True, help="target (vllm: PR #49572 format)"),
           out_path: Path = typer.Option(..., "--out", help="file (engines) or folder (checkpoint)"),
           model: Optional[str] = typer.Option(None, "--model", help="hf-checkpoint: packaged "
                                               "model name or folder to permute"),
           num_hidden_layers: Optional[int] = typer.Option(
               None, "--num-hidden-layers", help="sglang, for a placement that does not record "
                                                 "its model's layers: rows to write",
               callback=bound(1, LAYERS_MAX)),
           first_k_dense_replace: Optional[int] = typer.Option(
               None, "--first-k-dense-replace", help="sglang, likewise: leading dense layers",
               callback=bound(0, LAYERS_MAX)),
           as_json: bool = json_option()) -> None:
    """Write a placement for an engine (and print the engine flags that go with it), or a
    permuted checkpoint that realises it."""
    from sempar.placement import Placement

    p = Placement.load(placement)
    if to == "hf-checkpoint":
        from sempar.export.checkpoint import permute_checkpoint
        from sempar.models import resolve_model

        if model is None:
            raise InputError("--model: hf-checkpoint needs the model to permute")
        permute_checkpoint(resolve_model(model).model_dir, p, out_path)
        result: dict[str, Any] = {"engine": to, "path": str(out_path.absolute()), "flags": [],
                                  "versions": "any engine's contiguous EP split", "notes": []}
    else:
        from sempar.export.engines import write_engine_file

        result = write_engine_file(p, to, out_path, num_hidden_layers,
                                   first_k_dense_replace).to_json()
        if to == "vllm":
            from sempar.export.engines import vllm_plugin_launch

            result["released_vllm"] = vllm_plugin_launch(p, placement)
    sys.stderr.write(f"wrote {result['path']} ({to})\n")
    if as_json:
        emit_json(result)
    elif result["flags"]:
        import shlex

        sys.stdout.write(f"launch {to} with: {shlex.join(result['flags'])}\n")
        rel = result.get("released_vllm")
        if rel:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in rel["env"].items())
            sys.stdout.write(f"on released vLLM (no initial map; sempar's EPLB plug-in "
                             f"applies the placement at the first rebalance): {env} vllm serve "
                             f"MODEL {shlex.join(rel['flags'])}\n")
    for note in result["notes"]:
        sys.stderr.write(f"note: {note}\n")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
