"""A byte-level BPE tokenizer of 8,192 tokens trained with HF `tokenizers` on the corpus.

Each domain contributes at most `max_chars_per_domain` characters, so the large sources (code,
mathematics, documentation) do not crowd the small ones (chat, fortunes) out of the vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from sempar.atomic import atomic_path
from sempar.corpus.fetch import read_documents, verify_corpus
from sempar.paths import assets_dir

VOCAB_SIZE = 8192
EOS = "<|endoftext|>"
PAD = "<|pad|>"


def default_tokenizer_path() -> Path:
    return assets_dir() / "tokenizer.json"


def _balanced(corpus: Path, domains: list[str], max_chars: int) -> Iterator[str]:
    for domain in domains:
        used = 0
        for doc in read_documents(corpus, domain):
            if used >= max_chars:
                break
            used += len(doc)
            yield doc


def train_tokenizer(corpus: Path, out_file: Path, vocab_size: int = VOCAB_SIZE,
                    max_chars_per_domain: int = 4_000_000) -> Path:
    """Train and write tokenizer.json (atomically); returns its path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    manifest = verify_corpus(corpus)
    domains = sorted(f["domain"] for f in manifest["files"].values())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_balanced(corpus, domains, max_chars_per_domain), trainer)
    with atomic_path(out_file, suffix=".json") as tmp:
        tok.save(str(tmp))
    return Path(out_file)


def load_tokenizer(path: Path | None = None):
    """A `tokenizers.Tokenizer` (the committed one by default)."""
    from sempar.errors import InputError
    from sempar.models import FileTokenizer

    path = Path(path) if path else default_tokenizer_path()
    if not path.is_file():
        raise InputError(f"{path}: no tokenizer file")
    return FileTokenizer(path).tokenizer
