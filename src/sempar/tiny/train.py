"""`sempar train-tiny`: train a tiny MoE model from its config on this CPU.

AdamW (betas 0.9 / 0.95, weight decay 0.01), linear warm-up then cosine decay to 10%, batches of
`batch_size` windows of `seq_len` tokens; the loss is HF's causal-LM loss plus the router's
load-balancing loss (`output_router_logits=True`). Training stops at `minutes` of wall time or
`max_steps`. The model is saved in bf16 safetensors with its config, a loss-curve PNG and
train.json (loss reached, held-out loss, tokens seen, throughput), written to a temporary folder
and moved into place at the end.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np

from sempar.atomic import atomic_folder, check_folder_output
from sempar.tiny.data import TrainStream, split_corpus
from sempar.tiny.models import TINY_MODELS
from sempar.tiny.tokenizer import EOS, default_tokenizer_path, load_tokenizer


def _lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _heldout_loss(model, splits, tokenizer, seq_len: int, batches: int = 4) -> float:
    import torch

    eos = tokenizer.token_to_id(EOS)
    losses = []
    with torch.no_grad():
        for s in splits:
            ids: list[int] = []
            for enc in tokenizer.encode_batch(s.heldout[:200]):
                ids += enc.ids + [eos]
            arr = np.asarray(ids[: batches * 4 * (seq_len + 1)], np.int64)
            n = arr.size // (seq_len + 1)
            if n == 0:
                continue
            x = torch.from_numpy(arr[: n * (seq_len + 1)].reshape(n, seq_len + 1))
            out = model(input_ids=x, labels=x, output_router_logits=False)
            losses.append(out.loss.detach().item())
    return float(np.mean(losses)) if losses else float("nan")


def plot_loss(losses: list[float], aux: list[float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, lw=0.6, alpha=0.5, label="loss per step")
    if len(losses) >= 20:
        k = 20
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1:], smooth, lw=1.5, label="mean of 20 steps")
    ax2 = ax.twinx()
    ax2.plot(steps, aux, color="tab:red", lw=0.6, alpha=0.6)
    ax2.set_ylabel("load-balancing loss", color="tab:red")
    ax.set_xlabel("step")
    ax.set_ylabel("LM + aux loss")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train_tiny(name: str, corpus: Path, out_dir: Path, minutes: float = 25.0,
               max_steps: int | None = None, batch_size: int = 16, seq_len: int = 256,
               threads: int | None = None, seed: int = 0,
               progress: Callable[[int, float], None] | None = None) -> dict:
    """Train model `name` on the corpus; write it to `out_dir`; return the train.json dict."""
    import torch
    from transformers import AutoModelForCausalLM

    spec = TINY_MODELS.get(name)
    check_folder_output(out_dir, corpus, legacy=_model_files)   # refuse before the training
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(default_tokenizer_path())
    splits = split_corpus(Path(corpus), tokenizer)
    stream = TrainStream(splits, tokenizer, seq_len=seq_len, seed=seed)
    config = spec.make_config()
    model = AutoModelForCausalLM.from_config(config)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.01)
    budget = minutes * 60.0
    # The schedule needs a step count; estimate it from the first steps' speed.
    planned = max_steps or 10**9
    losses, aux = [], []
    t0 = time.perf_counter()
    step = 0
    while step < planned:
        elapsed = time.perf_counter() - t0
        if elapsed >= budget:
            break
        if step == 20 and max_steps is None:
            planned = int(20 * budget / max(elapsed, 1e-6))
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, planned if planned < 10**9 else 10_000, spec.lr)
        x = torch.from_numpy(stream.batch(batch_size))
        out = model(input_ids=x, labels=x)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.detach().item())
        aux.append(out.aux_loss.detach().item() if getattr(out, "aux_loss", None) is not None
                   else float("nan"))
        step += 1
        if progress:
            progress(step, losses[-1])
    seconds = time.perf_counter() - t0
    model.eval()
    heldout = _heldout_loss(model, splits, tokenizer, seq_len)
    info = {"model": name, "architecture": type(model).__name__, "parameters": int(params),
            "steps": step, "batch_size": batch_size, "seq_len": seq_len,
            "tokens_seen": int(step * batch_size * seq_len), "seconds": round(seconds, 1),
            "tokens_per_second": round(step * batch_size * seq_len / max(seconds, 1e-9), 1),
            "loss_last50": float(np.mean(losses[-50:])) if losses else None,
            "aux_loss_last50": float(np.nanmean(aux[-50:])) if aux else None,
            "heldout_lm_loss": heldout, "train_tokens_per_domain": stream.tokens(),
            "heldout_documents": {s.domain: len(s.heldout) for s in splits},
            "torch_threads": torch.get_num_threads(), "seed": seed}
    with atomic_folder(out_dir, "tiny-model", corpus, legacy=_model_files) as work:
        model.to(torch.bfloat16).save_pretrained(work, safe_serialization=True)
        shutil.copy(default_tokenizer_path(), work / "tokenizer.json")
        plot_loss(losses, aux, work / "loss.png", f"{name}: {step} steps, {seconds / 60:.0f} min")
        (work / "train.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


_MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "loss.png", "train.json"}


def _model_files(folder: Path) -> set[str]:
    """What a model folder written before the output marker holds (it has a train.json)."""
    return _MODEL_FILES if (folder / "train.json").is_file() else set()
