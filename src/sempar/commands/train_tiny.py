"""`sempar train-tiny`: the BPE tokenizer or a tiny MoE model, trained on the corpus (CPU)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import bound
from sempar.commands._options import seed_option
from sempar.errors import InputError


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
                   seed: int = seed_option()) -> None:
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


def register(app: typer.Typer) -> None:
    app.command("train-tiny")(train_tiny_cmd)
