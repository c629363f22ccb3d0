"""Record a `RoutingTrace` from a Hugging Face transformers MoE model (docs/design.md: `record`).

Routers are found and hooked by `sempar.trace.routers`, which keeps what each router itself
returned: the trace holds the EXACT experts the model used, not a recomputation.

Requests: every text is cut into requests at blank lines (one or more empty or whitespace-only
lines) and at lines that are exactly `DOC_MARKER`; each request is tokenised without special
tokens, truncated to `max_tokens`, and empty ones are skipped. Requests run in the given order,
`batch_size` at a time, right-padded with an attention mask (padded positions are dropped
from the capture; with causal attention they cannot influence the real tokens), under
`torch.no_grad()` in eval mode. Rows stream to `TraceWriter` in blocks, so memory is bounded by
one block whatever the corpus size (only the token ids of the corpus are held).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from sempar.errors import InputError, check_choice
from sempar.models import DTYPES, FileTokenizer, ModelSource, load_model, resolve_model
from sempar.trace.io import TraceWriter
from sempar.trace.routers import RoutingCapture, find_routers, sort_by_weight, trace_meta_for

DOC_MARKER = "<|doc|>"
FLUSH_ROWS = 32768  # rows buffered before a Parquet row group is written


# --------------------------------------------------------------------------- requests

def split_requests(text: str) -> list[str]:
    """Cut a text into requests at blank lines and at lines that are exactly `DOC_MARKER`.

    Returns the non-empty pieces in order (a piece of whitespace only is dropped).
    """
    pieces: list[str] = []
    cur: list[str] = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line == DOC_MARKER or not line.strip():
            if cur:
                pieces.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur:
        pieces.append("\n".join(cur))
    return pieces


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` without special tokens.

    Accepts a `tokenizers.Tokenizer`, a transformers tokenizer, or any object with
    `encode(text) -> list[int]`.
    """
    mod = type(tokenizer).__module__ or ""
    if mod.startswith("tokenizers"):
        return list(tokenizer.encode(text, add_special_tokens=False).ids)
    if mod.startswith("transformers"):
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return [int(t) for t in tokenizer.encode(text)]


@dataclass
class Requests:
    """Tokenised requests in order: `tokens[r]` int32[len_r], `domain[r]` index into `domains`."""

    tokens: list[np.ndarray] = field(default_factory=list)
    domain: list[int] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    truncated: int = 0
    skipped_empty: int = 0

    @property
    def total_tokens(self) -> int:
        return int(sum(t.size for t in self.tokens))


def tokenize_requests(tokenizer: Any, texts: Iterable[tuple[str, str | None]],
                      max_tokens: int = 512) -> Requests:
    """Split every (text, domain) into requests and tokenise them (see the module docstring)."""
    if max_tokens < 1:
        raise InputError(f"--max-tokens: {max_tokens} is not a positive integer")
    req = Requests()
    for text, domain in texts:
        d = -1
        if domain is not None:
            if domain not in req.domains:
                req.domains.append(domain)
            d = req.domains.index(domain)
        for piece in split_requests(text):
            ids = encode(tokenizer, piece)
            if not ids:
                req.skipped_empty += 1
                continue
            if len(ids) > max_tokens:
                req.truncated += 1
                ids = ids[:max_tokens]
            req.tokens.append(np.asarray(ids, dtype=np.int64).astype(np.int32))
            req.domain.append(d)
    return req


# --------------------------------------------------------------------------- recording

def _forward_kwargs(model: Any) -> dict[str, Any]:
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    kw: dict[str, Any] = {}
    if "use_cache" in params:
        kw["use_cache"] = False
    if "logits_to_keep" in params:  # skip the [batch, seq, vocab] LM head
        kw["logits_to_keep"] = 1
    if "output_router_logits" in params:
        kw["output_router_logits"] = False
    return kw


def _model_dtype(model: Any) -> str:
    try:
        return str(next(model.parameters()).dtype).replace("torch.", "")
    except StopIteration:
        return "unknown"


def record_requests(model: Any, requests: Requests, out_path: str | os.PathLike,
                    batch_size: int = 8, progress: Callable[[int], Any] | None = None,
                    model_name: str | None = None, max_tokens: int | None = None,
                    extra: dict[str, Any] | None = None, weights: bool = True) -> dict[str, Any]:
    """Run `requests` through `model` and write the captured routing to `out_path`.

    With `weights=False` only the expert ids are stored (a third of the bytes).

    Request ids are 0..R-1 in order; position = index within the request. `progress(n)` is
    called after each batch with its number of (real) tokens. Returns a summary dict.
    """
    import torch
    import transformers

    if batch_size < 1:
        raise InputError(f"--batch-size: {batch_size} is not a positive integer")
    if not requests.tokens:
        raise InputError("no tokens to record: every request is empty")
    sites = find_routers(model)
    name = model_name or getattr(model.config, "_name_or_path", None) or model.config.model_type
    info = {"recorder": "sempar.record", "dtype": _model_dtype(model),
            "max_tokens": max_tokens, "batch_size": batch_size, "padding": "right",
            "model_type": model.config.model_type, "router": type(sites[0].module).__name__,
            "transformers": transformers.__version__}
    info.update(extra or {})
    meta = trace_meta_for(model, sites, str(name), info)
    vocab = meta.vocab_size
    for r, t in enumerate(requests.tokens):
        if t.size and (int(t.max()) >= vocab or int(t.min()) < 0):
            bad = int(t[(t >= vocab) | (t < 0)][0])
            raise InputError(f"request {r}: token id {bad} is outside the model's vocabulary "
                             f"[0, {vocab}) (tokenizer and model do not match)")
    device = next(model.parameters()).device
    pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
    if not 0 <= pad_id < vocab:
        pad_id = 0
    fwd_kw = _forward_kwargs(model)
    was_training = model.training
    model.eval()
    has_domain = bool(requests.domains)
    buf: dict[str, list[np.ndarray]] = {k: [] for k in ("tok", "req", "pos", "dom", "ids", "w")}
    buffered = 0

    def flush(w: TraceWriter) -> None:
        nonlocal buffered
        if not buffered:
            return
        cat = {k: np.concatenate(v) for k, v in buf.items() if v}
        w.write(cat["tok"], cat["req"], cat["pos"], cat["ids"].astype(meta.expert_dtype),
                domain=cat["dom"] if has_domain else None, weights=cat["w"] if weights else None)
        for v in buf.values():
            v.clear()
        buffered = 0

    R = len(requests.tokens)
    try:
        with TraceWriter(out_path, meta, domains=requests.domains if has_domain else None,
                         has_weights=weights) as writer, \
                RoutingCapture(sites, meta.top_k, meta.num_experts) as cap, torch.no_grad():
            for lo in range(0, R, batch_size):
                batch = requests.tokens[lo: lo + batch_size]
                B, S = len(batch), max(t.size for t in batch)
                ids = np.full((B, S), pad_id, np.int64)
                mask = np.zeros((B, S), np.int64)
                for b, t in enumerate(batch):
                    ids[b, : t.size] = t
                    mask[b, : t.size] = 1
                cap.expect(B * S)
                model(input_ids=torch.from_numpy(ids).to(device),
                      attention_mask=torch.from_numpy(mask).to(device), **fwd_kw)
                experts, wts = cap.take()                # [B*S, L, k], row = b * S + s
                keep = mask.reshape(-1).astype(bool)
                experts, wts = experts[keep], wts[keep]
                T, L, k = experts.shape
                e2, w2 = sort_by_weight(experts.reshape(T * L, k), wts.reshape(T * L, k))
                lens = np.array([t.size for t in batch])
                buf["tok"].append(np.concatenate(batch).astype(np.int32))
                buf["req"].append(np.repeat(np.arange(lo, lo + B, dtype=np.int32), lens))
                buf["pos"].append(np.concatenate([np.arange(n, dtype=np.int32) for n in lens]))
                buf["dom"].append(np.repeat(np.asarray(requests.domain[lo: lo + B], np.int16), lens))
                buf["ids"].append(e2.reshape(T, L, k))
                buf["w"].append(w2.reshape(T, L, k))
                buffered += T
                if buffered >= FLUSH_ROWS:
                    flush(writer)
                if progress is not None:
                    progress(T)
            flush(writer)
    finally:
        if was_training:
            model.train()
    return {"out": str(out_path), "tokens": requests.total_tokens, "requests": R,
            "layers": meta.num_layers, "layer_ids": list(meta.layers),
            "experts": meta.num_experts, "top_k": meta.top_k, "model": meta.model,
            "domains": {d: int(sum(t.size for t, i in zip(requests.tokens, requests.domain)
                                   if i == j)) for j, d in enumerate(requests.domains)},
            "truncated_requests": requests.truncated}


def record(model: Any, tokenizer: Any, texts: Sequence[tuple[str, str | None]],
           out_path: str | os.PathLike, max_tokens: int = 512, batch_size: int = 8,
           progress: Callable[[int], Any] | None = None,
           model_name: str | None = None, weights: bool = True) -> dict[str, Any]:
    """Record the routing of `texts` ((text, domain or None) pairs) through `model`.

    `tokenizer` is a `tokenizers.Tokenizer`, a transformers tokenizer or any object with
    `encode(text) -> list[int]`. Writes a validated Parquet trace atomically to `out_path`
    (weights included) and returns a summary dict. The same inputs give byte-identical files.
    """
    requests = tokenize_requests(tokenizer, texts, max_tokens)
    return record_requests(model, requests, out_path, batch_size=batch_size, progress=progress,
                           model_name=model_name, max_tokens=max_tokens, weights=weights)


# --------------------------------------------------------------------------- texts

def parse_text_arg(arg: str) -> tuple[Path, str]:
    """`FILE[:DOMAIN]` -> (file, domain); the domain defaults to the file's stem.

    The argument is split at its last ':' only when the whole does not name a file and the
    part after ':' holds no '/' (so `C:/x.txt` and `dir:1/x.txt` stay paths).
    """
    p, domain = Path(arg), None
    if not p.exists() and ":" in arg:
        head, tail = arg.rsplit(":", 1)
        if tail and "/" not in tail and "\\" not in tail:
            p, domain = Path(head), tail
    if not p.exists():
        raise InputError(f"--text {arg}: no such file")
    if p.is_dir():
        raise InputError(f"--text {arg}: {p} is a folder, not a text file")
    from sempar.atomic import check_input

    return check_input(p, f"--text {arg}: text file"), domain or p.stem


def read_texts(args: Sequence[str]) -> list[tuple[str, str]]:
    """Read `FILE[:DOMAIN]` arguments into (text, domain) pairs (UTF-8)."""
    out = []
    for arg in args:
        path, domain = parse_text_arg(arg)
        try:
            out.append((path.read_text(encoding="utf-8"), domain))
        except UnicodeDecodeError as err:
            raise InputError(f"--text {arg}: not UTF-8 text (byte {err.start})") from None
    return out


class RecordJob:
    """What `sempar record` runs: resolve and load model + tokenizer, tokenise, then record.

        job = RecordJob.prepare("tiny-moe64", ["code.txt:code"], max_tokens=512)
        with progress_bar("record", job.total_tokens) as advance:
            summary = job.run("trace.parquet", batch_size=8, progress=advance)
    """

    def __init__(self, source: ModelSource, model: Any, requests: Requests, max_tokens: int):
        self.source = source
        self.model = model
        self.requests = requests
        self.max_tokens = max_tokens

    @classmethod
    def prepare(cls, model: str | os.PathLike, texts: Sequence[str], max_tokens: int = 512,
                dtype: str = "float32", out: str | os.PathLike | None = None) -> "RecordJob":
        """Read and tokenize the texts, check `out` (the output rule, the texts and the model
        folder being inputs), then load the model: every refusal comes before the slow load."""
        if not texts:
            raise InputError("--text: give at least one FILE[:DOMAIN]")
        check_choice("--dtype", dtype, DTYPES)
        source = resolve_model(model)
        pairs = read_texts(texts)  # check the inputs before the (slow) model load
        requests = tokenize_requests(FileTokenizer(source.tokenizer_path), pairs, max_tokens)
        if not requests.tokens:
            raise InputError("--text: no tokens to record: every request is empty")
        if out is not None:
            from sempar.atomic import check_output

            check_output(out, source.model_dir)
        return cls(source, load_model(source.model_dir, dtype=dtype), requests, max_tokens)

    @property
    def total_tokens(self) -> int:
        return self.requests.total_tokens

    def run(self, out_path: str | os.PathLike, batch_size: int = 8,
            progress: Callable[[int], Any] | None = None, weights: bool = True) -> dict[str, Any]:
        return record_requests(self.model, self.requests, out_path, batch_size=batch_size,
                               progress=progress, model_name=self.source.name,
                               max_tokens=self.max_tokens, weights=weights)
