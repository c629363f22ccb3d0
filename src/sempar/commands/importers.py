"""`sempar import sglang` / `sempar import arrays`: routing recorded by a serving engine or dumped
by the user's own hooks as numpy arrays, converted into a trace."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import LAYERS_MAX, TOKENS_MAX, Bounds, NumberList, bound
from sempar.commands._names import lazy_help_option
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


def _key(role: str) -> Optional[str]:
    def help() -> str:
        from sempar.trace.array_files import DEFAULT_KEYS     # numpy: only for --help

        return f"array name (default: first of {', '.join(DEFAULT_KEYS[role])}; '' = none)"

    return lazy_help_option(None, f"--{role.replace('_', '-')}-key", help)


LAYER_IDS = NumberList("--layer-ids", Bounds(0, LAYERS_MAX - 1, integer=True), max_items=LAYERS_MAX)


def _layer_ids(value: Optional[str]) -> Optional[tuple[int, ...]]:
    return None if value is None else tuple(LAYER_IDS.parse(value) or ())


@import_app.command("arrays")
def import_arrays_cmd(files: list[Path] = typer.Argument(..., help=".npz / .npy files (one "
                                                                   "namespace of arrays)"),
                      out_file: Path = typer.Option(..., "--out", help="Parquet trace to write"),
                      model: Optional[str] = typer.Option(None, "--model",
                                                          help="model name stored in the trace; a "
                                                               "preset name also gives its shape"),
                      model_dir: Optional[Path] = typer.Option(None, "--model-dir",
                                                               help="HF model folder whose "
                                                                    "config.json gives the shape"),
                      num_experts: Optional[int] = typer.Option(None, "--num-experts",
                                                                callback=bound(1, 1_000_000)),
                      top_k: Optional[int] = typer.Option(None, "--top-k", callback=bound(1, 4096)),
                      shared_experts: Optional[int] = typer.Option(None, "--shared-experts",
                                                                   callback=bound(0, 1024)),
                      vocab_size: Optional[int] = typer.Option(None, "--vocab-size",
                                                               callback=bound(1, TOKENS_MAX)),
                      layer_ids: Optional[str] = typer.Option(None, "--layer-ids",
                                                              help="model layer of each column, "
                                                                   "e.g. 1,2,3",
                                                              callback=LAYER_IDS.callback),
                      num_hidden_layers: Optional[int] = typer.Option(None, "--num-hidden-layers",
                                                                      callback=bound(1, 1 << 16)),
                      experts_key: Optional[str] = _key("experts"),
                      weights_key: Optional[str] = _key("weights"),
                      token_id_key: Optional[str] = _key("token_id"),
                      request_offsets_key: Optional[str] = _key("request_offsets"),
                      request_id_key: Optional[str] = _key("request_id"),
                      position_key: Optional[str] = _key("position"),
                      domain_key: Optional[str] = _key("domain"),
                      request_domain_key: Optional[str] = _key("request_domain"),
                      domain_names_key: Optional[str] = _key("domain_names"),
                      layer_ids_key: Optional[str] = _key("layer_ids"),
                      licence: Optional[str] = typer.Option(None, "--licence",
                                                            help="the data's licence, kept in the "
                                                                 "trace's metadata"),
                      source: Optional[str] = typer.Option(None, "--source",
                                                           help="where the data comes from "
                                                                "(repository, path, commit), kept "
                                                                "in the trace's metadata"),
                      as_json: bool = json_option()) -> None:
    """Convert per-token routing dumped as numpy arrays (experts [T, L, k] and optional weights,
    token ids, requests, positions, domains) into a routing trace."""
    from sempar.atomic import check_output
    from sempar.progress import progress_bar
    from sempar.trace.arrays import import_arrays

    check_output(out_file, *files)
    keys = {role: v for role, v in (
        ("experts", experts_key), ("weights", weights_key), ("token_id", token_id_key),
        ("request_offsets", request_offsets_key), ("request_id", request_id_key),
        ("position", position_key), ("domain", domain_key),
        ("request_domain", request_domain_key), ("domain_names", domain_names_key),
        ("layer_ids", layer_ids_key)) if v is not None}
    shape = {"num_experts": num_experts, "top_k": top_k, "shared_experts": shared_experts,
             "vocab_size": vocab_size, "layer_ids": _layer_ids(layer_ids),
             "num_hidden_layers": num_hidden_layers}
    with progress_bar("import arrays", None) as advance:
        summary = import_arrays(files, out_file, keys=keys, model=model, model_dir=model_dir,
                                shape=shape, progress=advance,
                                provenance={k: v for k, v in (("licence", licence),
                                                              ("source", source)) if v is not None})
    if as_json:
        emit_json(summary)
    sys.stderr.write(f"wrote {out_file}: {summary['tokens']} tokens, {summary['requests']} "
                     f"requests, {summary['layers']} MoE layers x {summary['experts']} experts, "
                     f"top-{summary['top_k']}"
                     f"{'' if summary['has_token_ids'] else ', no token ids'}\n")


def _routed(engine_name: str, what: str) -> None:
    def cmd(files: list[Path] = typer.Argument(..., help=f"JSON lines of {what} responses (or "
                                                         '{"request", "response", "domain"} '
                                                         "objects)"),
            out_file: Path = typer.Option(..., "--out", help="Parquet trace to write"),
            model_dir: str = typer.Option(..., "--model-dir",
                                          help="model folder (config.json) or packaged name"),
            as_json: bool = json_option()) -> None:
        from sempar.atomic import check_output
        from sempar.capture.responses import import_responses
        from sempar.progress import progress_bar

        check_output(out_file, *files)
        with progress_bar(f"import {engine_name}-routed", None) as advance:
            summary = import_responses(engine_name, files, out_file, model_dir, progress=advance)
        if as_json:
            emit_json(summary)
        sys.stderr.write(f"wrote {out_file}: {summary['requests']} requests, "
                         f"{summary['tokens']} tokens ({summary['prefill_rows']} prefill, "
                         f"{summary['decode_rows']} decode rows), {summary['layers']} MoE layers "
                         f"x {summary['experts']} experts, top-{summary['top_k']}\n")

    cmd.__doc__ = (f"Convert {what} responses with routed experts (saved by your own client) "
                   "into a routing trace.")
    import_app.command(f"{engine_name}-routed")(cmd)


_routed("sglang", "SGLang /generate")
_routed("vllm", "vLLM token-in-token-out generate")


def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")
