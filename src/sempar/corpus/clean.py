"""Pure text-cleaning functions for the corpus sources (no I/O, so each is unit-tested).

Every function turns one raw file's text into documents (str). A document becomes one request
when traces are recorded, so documents hold no blank line: runs of blank lines are folded into
one newline (`fold_blank_lines`), which keeps the text readable and the request whole.
"""

from __future__ import annotations

import re
from typing import Iterator

_BLANKS = re.compile(r"\n(?:[ \t]*\n)+")


def fold_blank_lines(text: str) -> str:
    """Strip trailing spaces, fold runs of blank lines into one newline, trim the ends."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    # Only the blank lines go: the indentation of the line after them stays (code, reST).
    return _BLANKS.sub("\n", text).strip("\n")


_PROOF = re.compile(r"\$=.*?\$\.", re.S)
_STATEMENT_END = re.compile(r"\$\.")


def strip_metamath_proofs(text: str) -> str:
    """Remove every `$= ... $.` proof block of a Metamath database, keeping the `$.` that ends
    the statement (`label $p wff $= proof $.` becomes `label $p wff $.`)."""
    return _PROOF.sub("$.", text)


def metamath_documents(text: str, max_chars: int = 3000) -> Iterator[str]:
    """Split a proof-free Metamath database into documents of whole statements.

    A statement ends at `$.`; consecutive statements (with the comments before them) are
    grouped until a document would exceed `max_chars`.
    """
    buf: list[str] = []
    size = 0
    start = 0
    for m in _STATEMENT_END.finditer(text):
        piece = text[start:m.end()]
        start = m.end()
        if size and size + len(piece) > max_chars:
            doc = fold_blank_lines("".join(buf))
            if doc:
                yield doc
            buf, size = [], 0
        buf.append(piece)
        size += len(piece)
    tail = fold_blank_lines("".join(buf) + text[start:])
    if tail:
        yield tail


def split_fortunes(text: str) -> Iterator[str]:
    """Fortune cookies: separated by lines holding only `%`."""
    for cookie in re.split(r"^%[ \t]*$", text, flags=re.M):
        doc = fold_blank_lines(cookie)
        if doc:
            yield doc


def chatterbot_dialogues(data: dict) -> Iterator[str]:
    """A chatterbot-corpus YAML mapping -> one `User:`/`Bot:` dialogue per conversation.

    `conversations` is a list of lists of turns; turns alternate between the user and the bot.
    Non-string turns (some files nest lists) are flattened to their string parts.
    """
    for conv in data.get("conversations") or []:
        if not isinstance(conv, list):
            continue
        turns = [t for t in _strings(conv) if t.strip()]
        if len(turns) < 2:
            continue
        lines = [f"{'User' if i % 2 == 0 else 'Bot'}: {fold_blank_lines(t)}"
                 for i, t in enumerate(turns)]
        yield "\n".join(lines)


def _strings(items) -> Iterator[str]:
    for item in items:
        if isinstance(item, str):
            yield item
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            yield str(item)
        elif isinstance(item, list):
            yield from _strings(item)


def is_man_stub(raw: str) -> bool:
    """A man page that only includes another one (`.so man3/foo.3`)."""
    lines = [l for l in raw.splitlines() if l.strip() and not l.startswith(".\\\"")]
    return len(lines) <= 2 and any(l.startswith(".so ") for l in lines)


def gutenberg_body(text: str) -> str:
    """The text of a Project Gutenberg file without its licence header and footer, when marked."""
    start = re.search(r"^\*\*\* ?START OF.*$", text, flags=re.M)
    end = re.search(r"^\*\*\* ?END OF.*$", text, flags=re.M)
    lo = start.end() if start else 0
    hi = end.start() if end and end.start() > lo else len(text)
    return text[lo:hi]


def chunk(doc: str, max_chars: int = 4000) -> Iterator[str]:
    """Cut a long document at line boundaries into pieces of at most `max_chars` (a line longer
    than that is cut inside). Long plays and modules thus make many requests, not one that the
    recorder's token cap would truncate."""
    buf: list[str] = []
    size = 0
    for line in doc.split("\n"):
        while len(line) > max_chars:
            if buf and "".join(buf).strip():
                yield "\n".join(buf)
            buf, size = [], 0
            yield line[:max_chars]
            line = line[max_chars:]
        if buf and size + len(line) > max_chars:  # size counts the newlines already joined
            if "".join(buf).strip():
                yield "\n".join(buf)
            buf, size = [], 0
        size += len(line) + (1 if buf else 0)
        buf.append(line)
    if buf and "".join(buf).strip():
        yield "\n".join(buf)
