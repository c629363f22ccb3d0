"""Training and held-out data for the tiny models, from a verified corpus.

Per domain the documents are shuffled with a fixed seed; the first ones, until they hold
`heldout_tokens` tokens counted as the recorder sees them (each request capped at
`request_cap` tokens), are held out: the models never train on them and the dev traces are
recorded on them. The rest are tokenised into one stream per domain (documents joined by the
end-of-text token), from which training windows are drawn with the domain chosen uniformly, so
small domains weigh as much as large ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sempar.corpus.fetch import read_documents, verify_corpus
from sempar.tiny.tokenizer import EOS

SPLIT_SEED = 20261122
HELDOUT_TOKENS = 48_000
REQUEST_CAP = 512


@dataclass
class DomainSplit:
    domain: str
    train: list[str]
    heldout: list[str]


def split_corpus(corpus: Path, tokenizer, heldout_tokens: int | None = None,
                 request_cap: int = REQUEST_CAP) -> list[DomainSplit]:
    """Deterministic train / held-out split of every domain (see the module docstring)."""
    if heldout_tokens is None:
        heldout_tokens = HELDOUT_TOKENS
    manifest = verify_corpus(corpus)
    out = []
    for domain in sorted(f["domain"] for f in manifest["files"].values()):
        docs = read_documents(corpus, domain)
        order = np.random.default_rng([SPLIT_SEED, len(docs)]).permutation(len(docs))
        held, total = [], 0
        for i in order:
            if total >= heldout_tokens:
                break
            held.append(int(i))
            total += min(len(tokenizer.encode(docs[i]).ids), request_cap)
        held_set = set(held)
        out.append(DomainSplit(domain, [d for i, d in enumerate(docs) if i not in held_set],
                               [docs[i] for i in held]))
    return out


class TrainStream:
    """Random windows of `seq_len + 1` tokens, domain chosen uniformly per window."""

    def __init__(self, splits: list[DomainSplit], tokenizer, seq_len: int = 256,
                 max_tokens_per_domain: int = 4_000_000, seed: int = 0):
        eos = tokenizer.token_to_id(EOS)
        self.seq_len = seq_len
        self.domains = [s.domain for s in splits]
        self.streams = []
        for s in splits:
            ids: list[int] = []
            for enc in tokenizer.encode_batch(s.train):
                ids.extend(enc.ids)
                ids.append(eos)
                if len(ids) >= max_tokens_per_domain:
                    break
            self.streams.append(np.asarray(ids[:max_tokens_per_domain], np.int64))
        self.rng = np.random.default_rng(seed)

    def batch(self, size: int) -> np.ndarray:
        """int64[size, seq_len + 1]."""
        out = np.empty((size, self.seq_len + 1), np.int64)
        for b in range(size):
            s = self.streams[self.rng.integers(len(self.streams))]
            lo = self.rng.integers(0, max(1, s.size - self.seq_len - 1))
            window = s[lo:lo + self.seq_len + 1]
            out[b, :window.size] = window
            out[b, window.size:] = window[-1] if window.size else 0
        return out

    def tokens(self) -> dict[str, int]:
        return {d: int(s.size) for d, s in zip(self.domains, self.streams)}


def write_heldout(corpus: Path, tokenizer, out_dir: Path) -> dict[str, Path]:
    """Write each domain's held-out documents to out_dir/<domain>.txt (DOC_MARKER-separated),
    the text `sempar record` turns into the dev traces. Returns {domain: path}.

    The folder follows `sempar.atomic.atomic_folder`: built beside, swapped in; a non-empty
    folder sempar did not write is refused."""
    from sempar.atomic import atomic_folder
    from sempar.corpus.fetch import DOC_MARKER

    out = {}
    with atomic_folder(out_dir, "heldout", corpus) as build:
        for s in split_corpus(Path(corpus), tokenizer):
            (build / f"{s.domain}.txt").write_text("".join(d + f"\n{DOC_MARKER}\n"
                                                           for d in s.heldout), encoding="utf-8")
            out[s.domain] = Path(out_dir) / f"{s.domain}.txt"
    return out
