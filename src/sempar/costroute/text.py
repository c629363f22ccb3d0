"""The text a cost-routing sweep runs (CAMoE §4.4-4.5 on a tiny model), tokenised into sequences.

Held-out documents of every corpus domain (`sempar.tiny.data.split_corpus`: never trained on),
or `--text FILE[:DOMAIN]` files, tokenised, joined by end-of-text, cut into `seq_len` sequences,
at most `tokens_per_domain` tokens per domain; sequences are interleaved across domains so every
batch mixes them (our choice: CAMoE does not say how it batches). One batch (`batch_size`
sequences) = one forward = one all-to-all sample (a last, partial batch counts for quality but
not for the all-to-all figures).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sempar.errors import InputError


@dataclass
class Sequences:
    """tokens[i]: int64[<= seq_len]; domain[i]: index into domains; interleaved order."""

    tokens: list[np.ndarray] = field(default_factory=list)
    domain: list[int] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)

    def tokens_per_domain(self) -> dict[str, int]:
        out = {d: 0 for d in self.domains}
        for t, d in zip(self.tokens, self.domain):
            out[self.domains[d]] += int(t.size)
        return out


def chunk_streams(streams: dict[str, list[list[int]]], eos: int, seq_len: int,
                  tokens_per_domain: int) -> Sequences:
    """Join each domain's documents (token lists) with `eos`, cut into `seq_len` pieces up to
    `tokens_per_domain` tokens, and interleave the domains' pieces round-robin."""
    if seq_len < 2 or tokens_per_domain < 2:
        raise InputError(f"--seq-len {seq_len} and --tokens-per-domain {tokens_per_domain} "
                         "must be at least 2")
    per: dict[str, list[np.ndarray]] = {}
    for domain, docs in streams.items():
        ids: list[int] = []
        for d in docs:
            if len(ids) >= tokens_per_domain:
                break
            ids.extend(d)
            ids.append(eos)
        ids = ids[:tokens_per_domain]
        pieces = [np.asarray(ids[i:i + seq_len], np.int64) for i in range(0, len(ids), seq_len)]
        pieces = [p for p in pieces if p.size >= 2]
        if pieces:
            per[domain] = pieces
    if not per:
        raise InputError("no held-out text: every domain is empty")
    out = Sequences(domains=sorted(per))
    for i in range(max(len(v) for v in per.values())):
        for j, d in enumerate(out.domains):
            if i < len(per[d]):
                out.tokens.append(per[d][i])
                out.domain.append(j)
    return out


def heldout_sequences(corpus: Path, tokenizer_path: Path, tokens_per_domain: int,
                      seq_len: int) -> Sequences:
    """Held-out text of every domain of a `sempar corpus fetch` folder (see module docstring)."""
    from sempar.models import FileTokenizer
    from sempar.tiny.data import split_corpus
    from sempar.tiny.tokenizer import EOS

    tok = FileTokenizer(tokenizer_path).tokenizer
    splits = split_corpus(Path(corpus), tok, heldout_tokens=tokens_per_domain)
    streams = {s.domain: [e.ids for e in tok.encode_batch(s.heldout, add_special_tokens=False)]
               for s in splits}
    return chunk_streams(streams, tok.token_to_id(EOS) or 0, seq_len, tokens_per_domain)


def text_sequences(pairs: Sequence[tuple[str, str]], tokenizer_path: Path, tokens_per_domain: int,
                   seq_len: int) -> Sequences:
    """(text, domain) pairs -> sequences (each text one document of its domain)."""
    from sempar.models import FileTokenizer
    from sempar.tiny.tokenizer import EOS

    tok = FileTokenizer(tokenizer_path).tokenizer
    streams: dict[str, list[list[int]]] = {}
    for text, domain in pairs:
        streams.setdefault(domain, []).append(tok.encode(text, add_special_tokens=False).ids)
    return chunk_streams(streams, tok.token_to_id(EOS) or 0, seq_len, tokens_per_domain)


def load_sequences(cfg: Any, tokenizer_path: Path) -> Sequences:
    """The text of a sweep (`cfg`: a `SweepConfig` or anything with its `texts`, `corpus`,
    `tokens_per_domain`, `seq_len`): `--text FILE[:DOMAIN]` files, else the corpus's held-out documents."""
    import os

    if cfg.texts:
        from sempar.trace.record import read_texts

        return text_sequences(read_texts(list(cfg.texts)), tokenizer_path, cfg.tokens_per_domain,
                              cfg.seq_len)
    corpus = cfg.corpus or os.environ.get("SEMPAR_CORPUS")
    if not corpus:
        raise InputError("give --corpus DIR (`sempar corpus fetch --out DIR` builds it), "
                         "$SEMPAR_CORPUS, or --text FILE[:DOMAIN]")
    return heldout_sequences(Path(corpus), tokenizer_path, cfg.tokens_per_domain, cfg.seq_len)
