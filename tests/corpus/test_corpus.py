"""The corpus: the pure cleaning functions (known answers) and `fetch_corpus` / `verify_corpus` /
`read_documents` driven by fake sources, so nothing is downloaded (no network, no apt, no pip)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from sempar.atomic import MARKER as OUTPUT_MARKER
from sempar.corpus import clean, fetch
from sempar.corpus.fetch import (DOC_MARKER, FORMAT, MANIFEST, MAX_DOC_CHARS, FetchError, Source,
                                 fetch_corpus, read_documents, verify_corpus)
from sempar.errors import InputError
from sempar.registry import Registry

# --------------------------------------------------------------------------------------------
# clean: fold_blank_lines
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, expected", [
    ("a \r\nb\t\r\n", "a\nb"),                                   # CRLF, trailing blanks
    ("a\n\n\nb", "a\nb"),                                        # run of blank lines -> one \n
    ("a\n \n\t\n   \nb", "a\nb"),                                # whitespace-only lines count
    ("\n\n  first\n  indented\n\n\nsecond  \n\n", "  first\n  indented\nsecond"),  # ends trimmed
    ("x\r\n\r\n\r\ny", "x\ny"),
    ("keep\nsingle\nnewlines", "keep\nsingle\nnewlines"),
    ("  \n\t\n", ""),
    ("", ""),
])
def test_fold_blank_lines(raw, expected):
    assert clean.fold_blank_lines(raw) == expected


def test_fold_blank_lines_leaves_no_blank_line():
    out = clean.fold_blank_lines("p1 \n\n\n\np2\n \np3\r\n\r\np4\t\n  p5\n")
    assert out == "p1\np2\np3\np4\n  p5"
    assert all(line.strip() for line in out.split("\n"))


def test_fold_blank_lines_keeps_indentation_after_a_blank_line():
    code = "def f():\n    x = 1\n\n    return x\n\n\nclass A:\n    pass\n"
    assert clean.fold_blank_lines(code) == "def f():\n    x = 1\n    return x\nclass A:\n    pass"


# --------------------------------------------------------------------------------------------
# clean: Metamath
# --------------------------------------------------------------------------------------------

METAMATH = """\
$( A tiny database. $)
$c ( ) -> wff |- $.
$v ph ps $.
wph $f wff ph $.
wps $f wff ps $.
wi $a wff ( ph -> ps ) $.
ax-1 $a |- ( ph -> ( ps -> ph ) ) $.
${
  min $e |- ph $.
  maj $e |- ( ph -> ps ) $.
  ax-mp $a |- ps $.
$}
th1 $p |- ( ph -> ph ) $=
  ( wi ax-1 ax-mp
    wph wps ) ABCDE
  FGH $.
th2 $p |- ( ps -> ps ) $= ( wi ) AB $.
"""

METAMATH_NO_PROOFS = """\
$( A tiny database. $)
$c ( ) -> wff |- $.
$v ph ps $.
wph $f wff ph $.
wps $f wff ps $.
wi $a wff ( ph -> ps ) $.
ax-1 $a |- ( ph -> ( ps -> ph ) ) $.
${
  min $e |- ph $.
  maj $e |- ( ph -> ps ) $.
  ax-mp $a |- ps $.
$}
th1 $p |- ( ph -> ph ) $.
th2 $p |- ( ps -> ps ) $.
"""


def test_strip_metamath_proofs_exact():
    assert clean.strip_metamath_proofs(METAMATH) == METAMATH_NO_PROOFS


def test_strip_metamath_proofs_details():
    out = clean.strip_metamath_proofs(METAMATH)
    assert "$=" not in out and "ABCDE" not in out and "FGH" not in out
    assert out.count("$.") == METAMATH.count("$.")        # every statement keeps its end
    for line in METAMATH.splitlines():                      # $a / $e / $f / $c / $v untouched
        if any(k in line for k in ("$a ", "$e ", "$f ", "$c ", "$v ")):
            assert line in out.splitlines()
    # no proof at all: unchanged
    assert clean.strip_metamath_proofs("wph $f wff ph $.\n") == "wph $f wff ph $.\n"


def test_metamath_documents_groups_whole_statements():
    text = "a1 $a x $.\na2 $a yy $.\na3 $a zzz $.\na4 $a w $.\n"
    # the statements are 10, 12 (with the preceding \n), 13 and 11 characters long
    assert list(clean.metamath_documents(text, max_chars=25)) == [
        "a1 $a x $.\na2 $a yy $.", "a3 $a zzz $.\na4 $a w $."]
    assert list(clean.metamath_documents(text, max_chars=10)) == [
        "a1 $a x $.", "a2 $a yy $.", "a3 $a zzz $.", "a4 $a w $."]
    assert list(clean.metamath_documents(text, max_chars=10_000)) == [text.strip()]


def test_metamath_documents_keep_comments_and_tail():
    text = "$( first $)\na $a x $.\n\n\n$( second $)\nb $a y $.\ntrailing words"
    docs = list(clean.metamath_documents(text, max_chars=20))
    assert docs == ["$( first $)\na $a x $.", "$( second $)\nb $a y $.\ntrailing words"]


def test_metamath_documents_on_stripped_database():
    stripped = clean.strip_metamath_proofs(METAMATH)
    docs = list(clean.metamath_documents(stripped, max_chars=120))
    assert len(docs) > 1
    for doc in docs:
        assert doc.endswith("$.") or doc.endswith("$}")
        assert "\n\n" not in doc
    # whole statements: every statement line of the database is inside exactly one document
    for line in stripped.splitlines():
        if line.strip():
            assert sum(line.strip() in d.split("\n") or line in d.split("\n") for d in docs) == 1
    # a statement longer than max_chars still makes one whole document
    long_stmt = "big $a " + "x " * 100 + "$.\nsmall $a y $.\n"
    assert list(clean.metamath_documents(long_stmt, max_chars=50)) == [
        "big $a " + "x " * 100 + "$.", "small $a y $."]


# --------------------------------------------------------------------------------------------
# clean: fortunes, chatterbot, man pages, Gutenberg
# --------------------------------------------------------------------------------------------


def test_split_fortunes():
    text = ("Erste Weisheit.\n  -- Autor\n%\n%\n \n%\nZweite\n\n\nZeile \n%   \n"
            "Тише едешь — дальше будешь.\n%\n")
    assert list(clean.split_fortunes(text)) == [
        "Erste Weisheit.\n  -- Autor", "Zweite\nZeile", "Тише едешь — дальше будешь."]
    # a % inside a line does not split; text without separators is one cookie
    assert list(clean.split_fortunes("100% sure\n50 %\n")) == ["100% sure\n50 %"]
    assert list(clean.split_fortunes("%\n%\n")) == []


def test_chatterbot_dialogues():
    data = {
        "categories": ["greetings"],
        "conversations": [
            ["Hello", "Hi there!", "How are you?", "Fine.\n\n\nThanks. "],
            ["only one turn"],                         # single turn: dropped
            ["What is 6 times 7?", 42],                # numbers stringified
            ["nested", ["a", ["b", 3.5]], True, None],  # lists flattened; bool/None skipped
            ["", "   ", "lonely"],                     # blank turns do not count
            "not a list",
            [],
        ],
    }
    assert list(clean.chatterbot_dialogues(data)) == [
        "User: Hello\nBot: Hi there!\nUser: How are you?\nBot: Fine.\nThanks.",
        "User: What is 6 times 7?\nBot: 42",
        "User: nested\nBot: a\nUser: b\nBot: 3.5",
    ]
    assert list(clean.chatterbot_dialogues({})) == []
    assert list(clean.chatterbot_dialogues({"conversations": None})) == []


def test_chatterbot_dialogues_from_yaml():
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load("categories:\n- ai\nconversations:\n- - What are you?\n"
                          "  - I am a bot.\n- - Count\n  - - 1\n    - 2\n")
    assert list(clean.chatterbot_dialogues(data)) == [
        "User: What are you?\nBot: I am a bot.", "User: Count\nBot: 1\nUser: 2"]


def test_is_man_stub():
    assert clean.is_man_stub(".so man3/foo.3\n")
    assert clean.is_man_stub('.\\" Copyright line\n.\\" another comment\n\n.so man3/foo.3\n')
    assert clean.is_man_stub(".TH STUB 3\n.so man3/bar.3\n")
    real = (".TH FOO 3 2024-01-01 \"Linux\" \"Manual\"\n.SH NAME\nfoo \\- do a thing\n"
            ".SH SYNOPSIS\n.B #include <foo.h>\n.SH DESCRIPTION\nThe function does it.\n")
    assert not clean.is_man_stub(real)
    assert not clean.is_man_stub(real + ".so man3/extra.3\n")
    assert not clean.is_man_stub(".TH SHORT 1\n.SH NAME\n")   # short, but no .so
    assert not clean.is_man_stub("")


def test_gutenberg_body():
    text = ("The Project Gutenberg EBook of Hamlet\nLicense blah\n"
            "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n"
            "ACT I\nEnter Ghost.\n"
            "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\nEnd of license\n")
    assert clean.gutenberg_body(text) == "\nACT I\nEnter Ghost.\n"
    # no markers: whole text
    plain = "ACT I\nSCENE I. Elsinore.\n"
    assert clean.gutenberg_body(plain) == plain
    # only a START marker: everything after it
    assert clean.gutenberg_body("hdr\n***START OF X\nbody\n") == "\nbody\n"
    # only an END marker: everything before it
    assert clean.gutenberg_body("body\n*** END OF X\nfooter\n") == "body\n"
    # markers must begin a line
    inline = "he said *** START OF nothing\nrest\n"
    assert clean.gutenberg_body(inline) == inline


# --------------------------------------------------------------------------------------------
# clean: chunk
# --------------------------------------------------------------------------------------------


def test_chunk_short_document_is_one_piece():
    assert list(clean.chunk("a\nb\nc", 100)) == ["a\nb\nc"]
    assert list(clean.chunk("", 100)) == []
    assert list(clean.chunk("  \n \n", 100)) == []


def test_chunk_cuts_at_line_boundaries():
    lines = [f"line {i:03d} " + "w" * (i % 17) for i in range(200)]
    doc = "\n".join(lines)
    pieces = list(clean.chunk(doc, 100))
    assert len(pieces) > 10
    assert all(0 < len(p) <= 100 for p in pieces)
    assert "\n".join(pieces) == doc
    # every piece is made of whole lines
    for p in pieces:
        for line in p.split("\n"):
            assert line in lines


def test_chunk_line_of_exactly_max_chars():
    doc = "a" * 10 + "\n" + "b" * 10 + "\n" + "c" * 3
    pieces = list(clean.chunk(doc, 10))
    assert pieces == ["a" * 10, "b" * 10, "c" * 3]
    assert "\n".join(pieces) == doc


def test_chunk_cuts_an_overlong_line():
    doc = "head\n" + "x" * 25 + "\ntail"
    pieces = list(clean.chunk(doc, 10))
    assert pieces == ["head", "x" * 10, "x" * 10, "x" * 5 + "\ntail"]
    assert all(len(p) <= 10 for p in pieces)
    assert "".join(p.replace("\n", "") for p in pieces) == doc.replace("\n", "")
    single = "y" * 4001
    assert list(clean.chunk(single)) == ["y" * 4000, "y"]


def test_chunk_never_yields_an_empty_piece():
    pieces = list(clean.chunk("x" * 9 + "\n\n" + "y" * 15, 10))
    assert all(p.strip() for p in pieces), pieces


# --------------------------------------------------------------------------------------------
# fetch: fake sources, no downloads
# --------------------------------------------------------------------------------------------


class FakeWorld:
    """Fake sources whose `_download` returns a local folder; counts the downloads."""

    def __init__(self, base: Path, monkeypatch):
        self.base = base
        self.calls: list[str] = []
        self.fail_download: set[str] = set()
        self.registry: Registry[Source] = Registry("corpus source")
        monkeypatch.setattr(fetch, "SOURCES", self.registry)
        monkeypatch.setattr(fetch, "_download", self._download)

    def _download(self, src: Source, work: Path):
        self.calls.append(src.name)
        if src.name in self.fail_download:
            raise FetchError(f"package {src.package}: apt-get download failed: E: no such package")
        root = self.base / "packages" / src.name
        return root, {"package": src.package, "sha256": "0" * 64}

    def add(self, name: str, domain: str, docs: list[str] | None = None, documents=None) -> None:
        """A source whose documents are the files of its folder, read in name order."""
        root = self.base / "packages" / name
        root.mkdir(parents=True)
        for i, doc in enumerate(docs or []):
            (root / f"{i:05d}.txt").write_bytes(doc.encode("utf-8"))

        def read(r: Path):
            for path in sorted(r.iterdir()):
                yield path.read_bytes().decode("utf-8")

        self.registry.add(name, Source(name, domain, "local", f"pkg-{name}", documents or read))


CODE_DOCS = [f"def f{i}(x):\n    return x * {i}\n# comment {i}" for i in range(7)]
CHAT_DOCS = ["User: Hallo\nBot: Hallo! Wie geht's?", "User: Привет\nBot: Здравствуй, мир — ёж"]
RU_DOCS = ["Тише едешь — дальше будешь.", "Übung macht den Meister. Grüße aus Köln"]
LONG_DOC = "\n".join(f"{i:05d} " + "lorem ipsum dolor " * 5 for i in range(400))  # ~38 kB


@pytest.fixture
def world(tmp_path, monkeypatch) -> FakeWorld:
    w = FakeWorld(tmp_path, monkeypatch)
    w.add("code-src", "code", CODE_DOCS + [LONG_DOC])
    w.add("chat-src", "chat", CHAT_DOCS)
    w.add("de-src", "de-ru", RU_DOCS[1:])
    w.add("ru-src", "de-ru", RU_DOCS[:1])
    return w


def _listing(folder: Path) -> list[str]:
    """The corpus files of `folder`, without the output rule's marker (sempar.output_rule)."""
    return sorted(set(os.listdir(folder)) - {OUTPUT_MARKER})


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_fetch_corpus_writes_files_and_manifest(world, tmp_path):
    out = tmp_path / "corpus"
    seen: list[str] = []
    manifest = fetch_corpus(out, progress=seen.append)
    assert seen == ["code-src", "chat-src", "de-src", "ru-src"]
    assert _listing(out) == ["chat.txt", "code.txt", "de-ru.txt", MANIFEST]
    on_disk = json.loads((out / MANIFEST).read_text())
    assert on_disk == manifest
    assert manifest["format"] == FORMAT and manifest["doc_marker"] == DOC_MARKER
    long_pieces = list(clean.chunk(LONG_DOC, MAX_DOC_CHARS))
    assert len(long_pieces) >= 9
    expected_counts = {"code.txt": len(CODE_DOCS) + len(long_pieces), "chat.txt": 2,
                       "de-ru.txt": 2}
    for name, entry in manifest["files"].items():
        data = (out / name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["bytes"] == len(data)
        assert entry["domain"] == name[:-4]
        assert entry["documents"] == expected_counts[name]
    assert set(manifest["files"]) == set(expected_counts)
    assert manifest["sources"]["de-src"] == {"package": "pkg-de-src", "sha256": "0" * 64,
                                             "domain": "de-ru", "documents": 1}
    assert manifest["sources"]["code-src"]["documents"] == expected_counts["code.txt"]
    assert verify_corpus(out) == manifest
    # the documents are separated by a line holding the marker, each one ends with it
    text = (out / "chat.txt").read_text(encoding="utf-8")
    assert text == "".join(d + f"\n{DOC_MARKER}\n" for d in CHAT_DOCS)
    # no temporary sibling folder is left behind
    assert sorted(os.listdir(tmp_path)) == ["corpus", "packages"]


def test_read_documents_returns_documents_exactly(world, tmp_path):
    out = tmp_path / "corpus"
    fetch_corpus(out)
    long_pieces = list(clean.chunk(LONG_DOC, MAX_DOC_CHARS))
    assert read_documents(out, "code") == CODE_DOCS + long_pieces
    assert all(len(p) <= MAX_DOC_CHARS for p in long_pieces)
    assert "\n".join(long_pieces) == LONG_DOC
    assert read_documents(out, "chat") == CHAT_DOCS
    assert read_documents(out, "de-ru") == RU_DOCS[1:] + RU_DOCS[:1]   # in source order


def test_read_documents_unknown_domain(world, tmp_path):
    out = tmp_path / "corpus"
    fetch_corpus(out)
    with pytest.raises(InputError, match="has no domain 'math'"):
        read_documents(out, "math")


def test_fetch_corpus_subset_of_sources(world, tmp_path):
    out = tmp_path / "corpus"
    manifest = fetch_corpus(out, sources=["chat-src"])
    assert world.calls == ["chat-src"]
    assert set(manifest["sources"]) == {"chat-src"}
    assert _listing(out) == ["chat.txt", MANIFEST]
    with pytest.raises(InputError, match="unknown corpus source 'nope'"):
        fetch_corpus(tmp_path / "other", sources=["nope"])
    assert not (tmp_path / "other").exists()


def test_fetch_corpus_reuses_the_cache(world, tmp_path):
    out = tmp_path / "corpus"
    first = fetch_corpus(out)
    assert len(world.calls) == 4
    before = _snapshot(out)
    again = fetch_corpus(out)
    assert len(world.calls) == 4                 # nothing downloaded again
    assert again == first
    assert _snapshot(out) == before
    # the same sources in another order are the same cache
    fetch_corpus(out, sources=["ru-src", "de-src", "chat-src", "code-src"])
    assert len(world.calls) == 4


def test_fetch_corpus_force_refetches(world, tmp_path):
    out = tmp_path / "corpus"
    first = fetch_corpus(out)
    (out / "stray.txt").write_text("left from before")
    again = fetch_corpus(out, force=True)
    assert len(world.calls) == 8
    assert again == first
    assert not (out / "stray.txt").exists()      # the folder was rebuilt, not patched
    aside = sorted(os.listdir(tmp_path))           # ... and the old one moved aside, not deleted
    assert aside[:2] == ["corpus", "corpus.sempar-old-" + aside[1].split("-old-")[1]]
    assert (tmp_path / aside[1] / "stray.txt").read_text() == "left from before"


def test_fetch_corpus_rebuilds_a_corrupt_or_different_cache(world, tmp_path):
    out = tmp_path / "corpus"
    fetch_corpus(out)
    good = _snapshot(out)
    (out / "chat.txt").write_text("tampered", encoding="utf-8")
    fetch_corpus(out)
    assert len(world.calls) == 8
    assert _snapshot(out) == good
    # a cache made of other sources is rebuilt with the ones asked for
    fetch_corpus(out, sources=["chat-src"])
    assert world.calls[-1] == "chat-src" and len(world.calls) == 9
    assert _listing(out) == ["chat.txt", MANIFEST]


def _raise_oserror(root: Path):
    yield "one good document"
    raise OSError("disk on fire")


def _no_documents(root: Path):
    yield from ["", "   \n  "]   # documents that chunk to nothing


@pytest.mark.parametrize("case", ["download", "cleaning", "empty"])
def test_failing_source_names_the_package_and_leaves_nothing(world, tmp_path, case):
    if case == "download":
        world.fail_download.add("de-src")
        pattern = "package pkg-de-src: apt-get download failed"
    elif case == "cleaning":
        world.add("bad-src", "math", documents=_raise_oserror)
        pattern = "package pkg-bad-src: cleaning failed: disk on fire"
    else:
        world.add("bad-src", "math", documents=_no_documents)
        pattern = "package pkg-bad-src: no documents found"
    out = tmp_path / "corpus"
    with pytest.raises(FetchError, match=pattern):
        fetch_corpus(out)
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["packages"]   # no temporary sibling either


@pytest.mark.parametrize("case", ["download", "cleaning"])
def test_failing_refetch_keeps_the_good_corpus(world, tmp_path, case):
    out = tmp_path / "corpus"
    fetch_corpus(out)
    good = _snapshot(out)
    if case == "download":
        world.fail_download.add("chat-src")
        pattern = "package pkg-chat-src"
        sources = None
    else:
        world.add("bad-src", "math", documents=_raise_oserror)
        pattern = "package pkg-bad-src: cleaning failed"
        sources = [*world.registry.names()]
    with pytest.raises(FetchError, match=pattern):
        fetch_corpus(out, sources=sources, force=(case == "download"))
    assert _snapshot(out) == good
    assert verify_corpus(out) == json.loads(good[MANIFEST])
    assert sorted(os.listdir(tmp_path)) == ["corpus", "packages"]


def test_fetch_corpus_refuses_a_file_as_output(world, tmp_path):
    out = tmp_path / "corpus"
    out.write_text("not a folder")
    with pytest.raises(InputError, match="exists and is not a folder"):
        fetch_corpus(out)
    assert out.read_text() == "not a folder"


# --------------------------------------------------------------------------------------------
# verify_corpus
# --------------------------------------------------------------------------------------------


def test_verify_corpus_detects_a_modified_file(world, tmp_path):
    out = tmp_path / "corpus"
    fetch_corpus(out)
    path = out / "code.txt"
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01                               # one flipped bit, same size
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="code.txt: checksum differs from the manifest"):
        verify_corpus(out)


def test_verify_corpus_detects_a_missing_file(world, tmp_path):
    out = tmp_path / "corpus"
    fetch_corpus(out)
    (out / "de-ru.txt").unlink()
    with pytest.raises(InputError, match="de-ru.txt: listed in the manifest but missing"):
        verify_corpus(out)


def test_verify_corpus_without_a_manifest(tmp_path):
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "code.txt").write_text("x\n<|doc|>\n")
    with pytest.raises(InputError, match="no manifest.json; run `sempar corpus fetch"):
        verify_corpus(out)
    with pytest.raises(InputError, match="no manifest.json"):
        verify_corpus(tmp_path / "does-not-exist")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"format": 1}', '"text"'])
def test_verify_corpus_rejects_a_bad_manifest(tmp_path, content):
    (tmp_path / MANIFEST).write_text(content)
    with pytest.raises(InputError, match="not a sempar corpus manifest"):
        verify_corpus(tmp_path)


def test_hand_written_corpus_verifies(tmp_path):
    """The documented folder format, written by hand, is what verify/read accept."""
    docs = ["first doc\nline two", "zweites Dokument: Grüße", "третий"]
    data = "".join(d + f"\n{DOC_MARKER}\n" for d in docs).encode("utf-8")
    (tmp_path / "chat.txt").write_bytes(data)
    manifest = {"format": 1, "doc_marker": DOC_MARKER, "sources": {},
                "files": {"chat.txt": {"domain": "chat",
                                       "sha256": hashlib.sha256(data).hexdigest(),
                                       "bytes": len(data), "documents": 3}}}
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    assert verify_corpus(tmp_path) == manifest
    assert read_documents(tmp_path, "chat") == docs


def test_read_documents_keeps_a_carriage_return(tmp_path, monkeypatch):
    w = FakeWorld(tmp_path, monkeypatch)
    w.add("cr-src", "chat", ["progress 10%\rprogress 20%\nnext line"])
    fetch_corpus(tmp_path / "corpus")
    assert read_documents(tmp_path / "corpus", "chat") == ["progress 10%\rprogress 20%\nnext line"]
