"""The prompts file of `sempar capture`: JSON lines, one prompt each, with `text` (tokenised by
the model's tokenizer, without special tokens, as `sempar record` does) or `input_ids` (token
ids), an optional `domain` (a name) and an optional `id` (kept in the trace's provenance)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sempar.errors import InputError

PROMPTS_MAX = 10_000_000          # lines of a prompts file
PROMPT_TOKENS_MAX = 1 << 20       # tokens of one prompt
# Bytes of one line, checked before it is parsed or tokenised: 2^20 tokens of text escaped as
# JSON stay below it; tokenising holds ~20x the text (a 1 GiB line took 22.9 GB), so ~0.7 GB.
PROMPT_LINE_BYTES_MAX = 32 << 20


@dataclass
class Prompts:
    """ids[i]: the token ids of prompt i (int32 array); domain[i]: index into `domains` (-1: none);
    names[i]: its `id` (None when absent); sha256: the file's digest (a resumed run checks it)."""

    ids: list[np.ndarray]
    domain: list[int]
    domains: list[str]
    names: list[str | None]
    sha256: str


def _line(f: Any, p: Path, n: int) -> bytes | None:
    """The next line of `f`, at most PROMPT_LINE_BYTES_MAX bytes read (None at the end): a
    1 GiB line is refused after 32 MiB, before it is parsed or tokenised."""
    raw = f.readline(PROMPT_LINE_BYTES_MAX + 1)
    if len(raw) > PROMPT_LINE_BYTES_MAX:
        raise InputError(f"{p} line {n}: longer than {PROMPT_LINE_BYTES_MAX} bytes (a prompt "
                         f"holds at most {PROMPT_TOKENS_MAX} tokens)")
    return raw or None


def _name(value: Any, where: str, field: str) -> str:
    """A domain or id as text that any file can hold (UTF-8: no lone surrogate)."""
    from sempar.prompt import prompt_text

    return prompt_text(str(value), f"{where}: {field}", InputError)


def read_prompts(path: str | os.PathLike, tokenizer: Any | None) -> Prompts:
    """Parse and tokenise the prompts file; one line naming line and field on bad input."""
    from sempar.atomic import check_input
    from sempar.bounds import token_ids
    from sempar.prompt import prompt_text
    from sempar.safe_json import parse_json
    from sempar.trace.record import encode

    p = check_input(path, "--prompts JSON-lines file")
    digest = hashlib.sha256()
    out = Prompts([], [], [], [], "")
    with open(p, "rb") as f:
        n = 0
        while (raw := _line(f, p, n + 1)) is not None:
            n += 1
            digest.update(raw)
            if not raw.strip():
                continue
            if len(out.ids) >= PROMPTS_MAX:
                raise InputError(f"{p}: more than {PROMPTS_MAX} prompts")
            where = f"{p} line {n}"
            obj = parse_json(raw, where, max_bytes=PROMPT_LINE_BYTES_MAX)
            if not isinstance(obj, dict):
                raise InputError(f"{where}: not a JSON object")
            if ("text" in obj) == ("input_ids" in obj):
                raise InputError(f"{where}: give exactly one of text, input_ids")
            if "input_ids" in obj:
                ids = token_ids(obj["input_ids"], f"{where}: input_ids")
            else:
                if not isinstance(obj["text"], str):
                    raise InputError(f"{where}: text is not a string")
                if tokenizer is None:
                    raise InputError(f"{where}: a text prompt needs the model's tokenizer "
                                     "(--model-dir with a tokenizer.json), or give input_ids")
                ids = encode(tokenizer, prompt_text(obj["text"], f"{where}: text", InputError))
            if not ids:
                raise InputError(f"{where}: the prompt holds no tokens")
            if len(ids) > PROMPT_TOKENS_MAX:
                raise InputError(f"{where}: {len(ids)} tokens is above the limit {PROMPT_TOKENS_MAX}")
            dom = obj.get("domain")
            if dom is not None and (not isinstance(dom, str) or not dom):
                raise InputError(f"{where}: domain is not a non-empty string")
            if dom is not None:
                dom = _name(dom, where, "domain")
            if dom is not None and dom not in out.domains:
                out.domains.append(dom)
            name = obj.get("id")
            if name is not None and (not isinstance(name, (str, int)) or isinstance(name, bool)):
                raise InputError(f"{where}: id is not a string or number")
            out.ids.append(np.asarray(ids, dtype=np.int32))
            out.domain.append(out.domains.index(dom) if dom is not None else -1)
            out.names.append(None if name is None else _name(name, where, "id"))
    if not out.ids:
        raise InputError(f"{p}: no prompts")
    out.sha256 = digest.hexdigest()
    return out
