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

from sempar.errors import InputError
from sempar.trace.presets import PRESETS

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="sempar: cut expert-parallel communication of MoE inference.")
trace_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Inspect and check routing traces.")
app.add_typer(trace_app, name="trace")

err = Console(stderr=True)
out = Console()


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


@app.command()
def synth(preset: str = typer.Option(..., "--preset",
                                    help="model shape: " + ", ".join(PRESETS.names())),
          tokens: int = typer.Option(..., "--tokens", help="number of tokens"),
          requests: Optional[int] = typer.Option(None, "--requests",
                                                 help="number of requests (default tokens/256)"),
          seed: int = typer.Option(0, "--seed"),
          weights: bool = typer.Option(False, "--weights/--no-weights",
                                       help="also store router weights"),
          out_file: Path = typer.Option(..., "--out", help="Parquet trace to write")) -> None:
    """Generate a synthetic routing trace with the shape of a real MoE model."""
    from sempar.progress import progress_bar
    from sempar.trace.synth import SynthGenerator

    gen = SynthGenerator(preset, tokens, requests, seed, weights=weights)
    with progress_bar(f"synth {gen.shape.name}", tokens) as advance:
        gen.write(out_file, progress=advance)
    sys.stderr.write(f"wrote {out_file}: {tokens} tokens, {gen.requests} requests, "
                     f"{gen.shape.num_layers} layers x {gen.shape.num_experts} experts, "
                     f"top-{gen.shape.top_k}\n")


@app.command()
def analyze(trace: Optional[Path] = typer.Argument(None, help="Parquet trace"),
            out_dir: Optional[Path] = typer.Option(None, "--out", help="folder for JSON, PNGs, report"),
            as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
            devices: int = typer.Option(8, "--devices", help="G for device-level figures"),
            seed: int = typer.Option(0, "--seed"),
            max_tokens: int = typer.Option(1_000_000, "--max-tokens",
                                           help="analyse a random subset of whole requests above this"),
            olmoe_aggregates: Optional[Path] = typer.Option(
                None, "--olmoe-aggregates", help="also analyse the real OLMoE/Mixtral aggregates here")) -> None:
    """Affinity statistics: Sem-MoE Table 1, kurtosis, inter-layer affinity, domains, load tail."""
    from sempar.analyze import run_analyze

    result = run_analyze(trace, out_dir, devices=devices, seed=seed, max_tokens=max_tokens,
                         aggregates=olmoe_aggregates, quiet=as_json)
    if as_json:
        emit_json(result)


@app.command()
def demo(out_dir: Path = typer.Option(Path("sempar-demo"), "--out", help="folder for report.html"),
         as_json: bool = typer.Option(False, "--json", help="print summary.json on stdout")) -> None:
    """Run every stage sempar has on the embedded default data; write report.html and summary.json."""
    from sempar.demo import run_demo

    summary = run_demo(out_dir)
    if as_json:
        emit_json(summary)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app; bad input is one line on stderr and exit code 2."""
    from typer.exceptions import TyperException

    try:
        rv = app(args=argv, standalone_mode=False, prog_name="sempar")
    except InputError as e:
        _fail(str(e))
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("aborted\n")
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except TyperException as e:  # usage errors: unknown option, missing argument, no arguments
        if type(e).__name__ == "NoArgsIsHelpError":  # typer has printed the help already
            sys.exit(0)
        _fail(e.format_message())
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str) -> None:
    sys.stderr.write("error: " + " ".join(message.split()) + "\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
