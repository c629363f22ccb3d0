"""The prompts file of `sempar capture`: JSON lines, one prompt each, with `text` (tokenised by
the model's tokenizer, without special tokens, as `sempar record` does) or `input_ids` (token
ids), an optional `domain` (a name) and an optional `id` (kept in the trace's provenance)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sempar.errors import InputError

PROMPTS_MAX = 10_000_000          # lines of a prompts file
PROMPT_TOKENS_MAX = 1 << 20       # tokens of one prompt


@dataclass
class Prompts:
    """ids[i]: the token ids of prompt i (int32 array); domain[i]: index into `domains` (-1: none);
    names[i]: its `id` (None when absent); sha256: the file's digest (a resumed run checks it)."""

    ids: list[np.ndarray]
    domain: list[int]
    domains: list[str]
    names: list[str | None]
    sha256: str


def read_prompts(path: str | os.PathLike, tokenizer: Any | None) -> Prompts:
    """Parse and tokenise the prompts file; one line naming line and field on bad input."""
    from sempar.atomic import check_input
    from sempar.trace.record import encode

    p = check_input(path, "--prompts JSON-lines file")
    digest = hashlib.sha256()
    out = Prompts([], [], [], [], "")
    with open(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            digest.update(raw)
            if not raw.strip():
                continue
            if len(out.ids) >= PROMPTS_MAX:
                raise InputError(f"{p}: more than {PROMPTS_MAX} prompts")
            where = f"{p} line {n}"
            try:
                obj = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                raise InputError(f"{where}: not a JSON object") from None
            if not isinstance(obj, dict):
                raise InputError(f"{where}: not a JSON object")
            if ("text" in obj) == ("input_ids" in obj):
                raise InputError(f"{where}: give exactly one of text, input_ids")
            if "input_ids" in obj:
                ids = obj["input_ids"]
                arr = np.asarray(ids) if isinstance(ids, list) and ids else None
                if arr is None or arr.ndim != 1 or arr.dtype.kind != "i" or \
                        int(arr.min()) < 0 or int(arr.max()) >= 1 << 31:
                    raise InputError(f"{where}: input_ids is not a list of token ids")
            else:
                if not isinstance(obj["text"], str):
                    raise InputError(f"{where}: text is not a string")
                if tokenizer is None:
                    raise InputError(f"{where}: a text prompt needs the model's tokenizer "
                                     "(--model-dir with a tokenizer.json), or give input_ids")
                ids = encode(tokenizer, obj["text"])
            if not ids:
                raise InputError(f"{where}: the prompt holds no tokens")
            if len(ids) > PROMPT_TOKENS_MAX:
                raise InputError(f"{where}: {len(ids)} tokens is above the limit {PROMPT_TOKENS_MAX}")
            dom = obj.get("domain")
            if dom is not None and (not isinstance(dom, str) or not dom):
                raise InputError(f"{where}: domain is not a non-empty string")
            if dom is not None and dom not in out.domains:
                out.domains.append(dom)
            name = obj.get("id")
            if name is not None and not isinstance(name, (str, int)):
                raise InputError(f"{where}: id is not a string or number")
            out.ids.append(np.asarray(ids, dtype=np.int32))
            out.domain.append(out.domains.index(dom) if dom is not None else -1)
            out.names.append(None if name is None else str(name))
    if not out.ids:
        raise InputError(f"{p}: no prompts")
    out.sha256 = digest.hexdigest()
    return out
