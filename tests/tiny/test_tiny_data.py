"""The tiny models' tokenizer and data: trained and split on a small hand-written corpus folder
(documented format: `<domain>.txt` + manifest.json), so nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from sempar.corpus.fetch import DOC_MARKER, MANIFEST, read_documents  # noqa: E402
from sempar.errors import InputError  # noqa: E402
from sempar.tiny.data import DomainSplit, TrainStream, split_corpus  # noqa: E402
from sempar.tiny.tokenizer import EOS, PAD, load_tokenizer, train_tokenizer  # noqa: E402

VOCAB = 300
DOCS_PER_DOMAIN = 50

_CODE_WORDS = ["value", "index", "result", "items", "count", "name", "path", "data", "total"]
_DE = ["Über", "die", "Brücke", "gehen", "größere", "Mädchen", "schön", "Straße", "und", "Käse",
       "früh", "müde", "Bäume", "weiß"]
_RU = ["Привет", "мир", "ёжик", "в", "тумане", "съешь", "ещё", "этих", "мягких", "булок",
       "чаю", "дальше", "будешь"]
_CHAT = ["hello", "how", "are", "you", "fine", "thanks", "what", "is", "your", "name", "bot",
         "weather", "today", "nice"]
_MATH = ["ph", "ps", "ch", "wff", "->", "(", ")", "|-", "-.", "<->", "A.", "E."]


def _docs(domain: str, rng: random.Random) -> list[str]:
    out = []
    for i in range(DOCS_PER_DOMAIN):
        n = rng.randint(3, 12)
        if domain == "code":
            lines = [f"def fn_{i}(x):"] + [
                f"    {rng.choice(_CODE_WORDS)} = x + {rng.randint(0, 99)}" for _ in range(n)]
            lines.append(f"    return {rng.choice(_CODE_WORDS)}")
        elif domain == "de-ru":
            words = _DE if i % 2 else _RU
            lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) + "."
                     for _ in range(n)]
            lines.insert(0, f"Nr. {i}")
        elif domain == "chat":
            lines = [f"{'User' if j % 2 == 0 else 'Bot'}: "
                     + " ".join(rng.choice(_CHAT) for _ in range(rng.randint(2, 7))) + f" {i}?"
                     for j in range(n)]
        else:
            lines = [f"th{i}x{j} $p |- " + " ".join(rng.choice(_MATH) for _ in range(6)) + " $."
                     for j in range(n)]
        out.append("\n".join(lines))
    assert len(set(out)) == len(out)
    return out


DOMAIN_NAMES = ("chat", "code", "de-ru", "math")


def write_corpus(folder: Path) -> dict[str, list[str]]:
    """A corpus folder in the documented format; returns the documents per domain."""
    folder.mkdir(parents=True)
    rng = random.Random(1234)
    docs = {d: _docs(d, rng) for d in DOMAIN_NAMES}
    files = {}
    for domain, ds in docs.items():
        data = "".join(d + f"\n{DOC_MARKER}\n" for d in ds).encode("utf-8")
        (folder / f"{domain}.txt").write_bytes(data)
        files[f"{domain}.txt"] = {"domain": domain, "sha256": hashlib.sha256(data).hexdigest(),
                                  "bytes": len(data), "documents": len(ds)}
    manifest = {"format": 1, "doc_marker": DOC_MARKER, "sources": {}, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, list[str]]]:
    folder = tmp_path_factory.mktemp("tiny") / "corpus"
    return folder, write_corpus(folder)


@pytest.fixture(scope="module")
def tok_file(corpus, tmp_path_factory) -> Path:
    return train_tokenizer(corpus[0], tmp_path_factory.mktemp("tok") / "tok.json",
                           vocab_size=VOCAB)


@pytest.fixture(scope="module")
def tok(tok_file):
    return load_tokenizer(tok_file)


# --------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------


def test_corpus_fixture_reads_back(corpus):
    folder, docs = corpus
    for domain in DOMAIN_NAMES:
        assert read_documents(folder, domain) == docs[domain]


def test_tokenizer_vocab_and_special_tokens(tok, tok_file):
    assert tok_file.is_file()
    assert tok.get_vocab_size() == VOCAB
    vocab = tok.get_vocab()
    assert len(vocab) == VOCAB
    assert tok.token_to_id(EOS) == 0 and tok.token_to_id(PAD) == 1
    # the special token is one token, never split into bytes
    assert tok.encode(f"abc{EOS}").ids[-1] == 0
    # BPE learnt merges beyond the 256 byte symbols
    assert any(len(t) > 1 and t not in (EOS, PAD) for t in vocab)
    # the leftover files of the atomic write are gone
    assert sorted(p.name for p in tok_file.parent.iterdir()) == ["tok.json"]


@pytest.mark.parametrize("text", [
    "def fn_1(x):\n    return x + 1\n",
    "Hello, world!  Tabs\tand\nnewlines\n\n",
    "Über die Brücke gehen größere Mädchen; Straße, Käse.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "mixed 数学 ∀x ∃y (x → y) 🙂",
    "",
])
def test_tokenizer_round_trips(tok, text):
    ids = tok.encode(text).ids
    assert all(0 <= i < VOCAB for i in ids)
    assert tok.decode(ids) == text


def test_tokenizer_compresses_corpus_text(tok, corpus):
    doc = corpus[1]["code"][0]
    assert len(tok.encode(doc).ids) < len(doc.encode("utf-8"))


def test_tokenizer_training_is_deterministic(corpus, tok_file, tmp_path):
    again = train_tokenizer(corpus[0], tmp_path / "again.json", vocab_size=VOCAB)
    assert again.read_bytes() == tok_file.read_bytes()


def test_tokenizer_needs_a_verified_corpus(corpus, tmp_path):
    with pytest.raises(InputError, match="no manifest.json"):
        train_tokenizer(tmp_path, tmp_path / "t.json", vocab_size=VOCAB)
    with pytest.raises(InputError, match="no tokenizer file"):
        load_tokenizer(tmp_path / "missing.json")
    assert not (tmp_path / "t.json").exists()


# --------------------------------------------------------------------------------------------
# split_corpus
# --------------------------------------------------------------------------------------------

HELD, CAP = 300, 24


def _cost(tok, doc: str, cap: int = CAP) -> int:
    return min(len(tok.encode(doc).ids), cap)


@pytest.fixture(scope="module")
def splits(corpus, tok) -> list[DomainSplit]:
    return split_corpus(corpus[0], tok, heldout_tokens=HELD, request_cap=CAP)


def test_split_corpus_partitions_every_domain(splits, corpus):
    docs = corpus[1]
    assert [s.domain for s in splits] == sorted(DOMAIN_NAMES)
    for s in splits:
        assert s.heldout and s.train
        assert not set(s.train) & set(s.heldout)
        assert sorted(s.train + s.heldout) == sorted(docs[s.domain])
        # train keeps the corpus order
        assert s.train == [d for d in docs[s.domain] if d in set(s.train)]


def test_split_corpus_holds_out_just_enough_tokens(splits, tok):
    for s in splits:
        costs = [_cost(tok, d) for d in s.heldout]
        assert sum(costs) >= HELD
        assert sum(costs[:-1]) < HELD          # it stops as soon as the target is reached
        # the cap matters here: some documents are longer than it
    assert any(len(tok.encode(d).ids) > CAP for s in splits for d in s.heldout)


def test_split_corpus_is_deterministic_and_shuffled(splits, corpus, tok):
    again = split_corpus(corpus[0], tok, heldout_tokens=HELD, request_cap=CAP)
    assert again == splits
    docs = corpus[1]
    # held out in a shuffled order, not simply the first documents
    assert any(s.heldout != docs[s.domain][:len(s.heldout)] for s in splits)


def test_split_corpus_request_cap_changes_the_count(corpus, tok):
    uncapped = split_corpus(corpus[0], tok, heldout_tokens=HELD, request_cap=10**9)
    capped = split_corpus(corpus[0], tok, heldout_tokens=HELD, request_cap=10)
    for u, c in zip(uncapped, capped):
        assert sum(len(tok.encode(d).ids) for d in u.heldout) >= HELD
        assert sum(min(len(tok.encode(d).ids), 10) for d in c.heldout) >= HELD
        assert len(c.heldout) > len(u.heldout)
        # same shuffled order: the shorter held-out list is a prefix of the longer one
        assert c.heldout[:len(u.heldout)] == u.heldout


def test_split_corpus_exhausted_domain(corpus, tok):
    everything = split_corpus(corpus[0], tok, heldout_tokens=10**9, request_cap=CAP)
    for s in everything:
        assert s.train == []
        assert sorted(s.heldout) == sorted(corpus[1][s.domain])
    nothing = split_corpus(corpus[0], tok, heldout_tokens=0, request_cap=CAP)
    for s in nothing:
        assert s.heldout == [] and s.train == corpus[1][s.domain]


# --------------------------------------------------------------------------------------------
# TrainStream
# --------------------------------------------------------------------------------------------

SEQ = 16


@pytest.fixture(scope="module")
def stream_factory(splits, tok):
    return lambda seed=0, **kw: TrainStream(splits, tok, seq_len=SEQ, seed=seed, **kw)


def test_train_stream_tokens_are_the_train_documents(splits, tok, stream_factory):
    ts = stream_factory()
    assert ts.domains == [s.domain for s in splits]
    eos = tok.token_to_id(EOS)
    for s, stream in zip(splits, ts.streams):
        expected = []
        for d in s.train:
            expected += tok.encode(d).ids + [eos]
        assert stream.dtype == np.int64
        assert stream.tolist() == expected
        assert ts.tokens()[s.domain] == len(expected)


def test_train_stream_batch_shape_and_values(stream_factory):
    b = stream_factory().batch(4)
    assert b.shape == (4, SEQ + 1)
    assert b.dtype == np.int64
    assert b.min() >= 0 and b.max() < VOCAB


def test_train_stream_is_deterministic_per_seed(stream_factory):
    a, b, c = stream_factory(0), stream_factory(0), stream_factory(1)
    xa = [a.batch(4) for _ in range(5)]
    xb = [b.batch(4) for _ in range(5)]
    xc = [c.batch(4) for _ in range(5)]
    assert all(np.array_equal(p, q) for p, q in zip(xa, xb))
    assert not all(np.array_equal(p, q) for p, q in zip(xa, xc))


def test_train_stream_windows_come_from_every_domain(stream_factory):
    ts = stream_factory(3)
    windows = {d: {tuple(w) for w in np.lib.stride_tricks.sliding_window_view(s, SEQ + 1)}
               for d, s in zip(ts.domains, ts.streams)}
    used = {d: 0 for d in ts.domains}
    for _ in range(50):
        for row in ts.batch(4):
            found = [d for d, ws in windows.items() if tuple(row) in ws]
            assert found, "a window that is no contiguous slice of any train stream"
            used[found[0]] += 1
    assert all(n > 0 for n in used.values()), used
    assert sum(used.values()) == 200
    # domains are drawn uniformly: none gets far more than its quarter
    assert max(used.values()) < 100


def test_train_stream_max_tokens_per_domain(stream_factory):
    ts = stream_factory(max_tokens_per_domain=40)
    assert all(v == 40 for v in ts.tokens().values())
    b = ts.batch(8)
    assert b.shape == (8, SEQ + 1)
