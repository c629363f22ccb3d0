"""`sempar import sglang-routed / vllm-routed`: engine responses a user's own client saved, as
JSON lines, converted into a trace with the decoder `sempar capture` uses (`rows.py`).

Each line is one response (SGLang's /generate answer; vLLM's token-in-token-out generate answer),
or an object {"request": ..., "response": ..., "domain"?: name} when the request was saved with
it. The prompt's token ids come from the response (`prompt_token_ids`) or from the saved request
(`input_ids` / `token_ids`); a line with neither is refused (a trace without token ids cannot feed
the token-table methods). The payload's first position comes from the saved request
(`routed_experts_start_len` / `sampling_params.routed_experts_prompt_start`), else from its size.
Requests are numbered in line order across the files; prefill and decode rows are marked as by
`capture` (`meta.extra["capture"]["prompt_tokens"]`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from sempar.bounds import token_ids
from sempar.capture.engines import engine
from sempar.capture.job import trace_meta
from sempar.capture.payload import PayloadShape
from sempar.capture.rows import request_rows
from sempar.errors import InputError
from sempar.safe_json import json_lines, parse_json
from sempar.trace.io import TraceWriter

FLUSH_ROWS = 65536
# One saved response line: a 128k-token request of DeepSeek-V3's shape is 333 MB of base64
# (client.BODY_MAX bounds a live answer the same way).
RESPONSE_LINE_BYTES_MAX = 1 << 30


def _request_fields(engine_name: str, request: Any, where: str) -> tuple[list[int] | None, int | None]:
    """(prompt ids, start) a saved request sent, as far as it tells."""
    if request is None:
        return None, None
    if not isinstance(request, dict):
        raise InputError(f"{where}: request is not a JSON object")
    key = "input_ids" if engine_name == "sglang" else "token_ids"
    if engine_name == "vllm" and key not in request and isinstance(request.get("prompt"), list):
        key = "prompt"                  # a saved /v1/completions request (token ids as prompt)
    ids = request.get(key)
    if ids is not None:
        token_ids(ids, f"{where}: request.{key}")
    if engine_name == "sglang":
        start = request.get("routed_experts_start_len")
    else:
        params = request.get("sampling_params")
        start = params.get("routed_experts_prompt_start") if isinstance(params, dict) else None
        if start is None:               # /v1/completions and /v1/chat/completions: top level
            start = request.get("routed_experts_prompt_start")
    if start is not None and (not isinstance(start, int) or isinstance(start, bool)):
        raise InputError(f"{where}: routed-expert start {start!r} is not an integer")
    return ids, start


def import_responses(engine_name: str, paths: Sequence[str | os.PathLike],
                     out_path: str | os.PathLike, model_dir: str | os.PathLike,
                     progress: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Convert the saved responses of `paths` into a trace at `out_path` (module docstring)."""
    from sempar.atomic import check_input
    from sempar.capture.setup import model_shape

    spec = engine(engine_name)
    model, shape, _ = model_shape(model_dir, None)
    pshape = PayloadShape(shape["num_hidden_layers"], shape["top_k"], shape["num_experts"],
                          tuple(shape["layer_ids"]))
    files = [check_input(p, f"{engine_name}-routed responses file") for p in paths]
    capture = {"engine": engine_name, "files": [p.name for p in files], "model": model,
               "slot_order": "as the engine returned it", "prompt_tokens": []}
    domains: list[str] = []
    meta = trace_meta(model, shape, {"importer": f"sempar.import_{engine_name}_routed",
                                     "capture": capture})
    buf: list[tuple[int, int, Any]] = []
    buffered, decode_rows = 0, 0

    def flush(w: TraceWriter) -> None:
        nonlocal buffered
        if not buf:
            return
        lens = [r.position.shape[0] for _, _, r in buf]
        w.write(np.concatenate([r.token_id for _, _, r in buf]),
                np.repeat(np.asarray([i for i, _, _ in buf], np.int32), lens),
                np.concatenate([r.position for _, _, r in buf]),
                np.concatenate([r.experts for _, _, r in buf]),
                np.repeat(np.asarray([d for _, d, _ in buf], np.int16), lens),
                decode=np.concatenate([r.position >= r.prompt_len for _, _, r in buf]))
        buf.clear()
        buffered = 0

    # Domains are known only once every line is read; the column is written with all names
    # found in a first pass over the (small) JSON envelopes.
    domains = _domains(files)
    with TraceWriter(out_path, meta, domains or None, has_decode=True) as w:
        req = 0
        for p in files:
            with open(p, "rb") as f:
                for n, _, obj in json_lines(f, str(p), RESPONSE_LINE_BYTES_MAX):
                    where = f"{p} line {n}"
                    request, response, domain = None, obj, None
                    if isinstance(obj, dict) and "response" in obj:
                        request, response, domain = obj.get("request"), obj["response"], obj.get("domain")
                    ids, start = _request_fields(engine_name, request, where)
                    routed = spec.parse(response, where)
                    if routed.prompt_ids is None and ids is None:
                        raise InputError(f"{where}: no prompt token ids (save the request with "
                                         'the response: {"request": ..., "response": ...})')
                    rows = request_rows(spec, routed, pshape, meta.expert_dtype, where,
                                        prompt_ids=ids, start=start)
                    capture["prompt_tokens"].append(rows.prompt_len)
                    decode_rows += int((rows.position >= rows.prompt_len).sum())
                    buf.append((req, domains.index(domain) if domain in domains else -1, rows))
                    buffered += rows.position.shape[0]
                    req += 1
                    if buffered >= FLUSH_ROWS:
                        flush(w)
                    if progress is not None:
                        progress(1)
        if req == 0:
            raise InputError(f"{', '.join(map(str, files))}: no responses")
        flush(w)
    return {"out": str(out_path), "tokens": w.rows, "requests": req, "decode_rows": decode_rows,
            "prefill_rows": w.rows - decode_rows, "layers": meta.num_layers,
            "layer_ids": list(meta.layers), "experts": meta.num_experts, "top_k": meta.top_k,
            "model": model, "domains": domains}


def _domains(files: list[Path]) -> list[str]:
    """The domain names of the files' {"request", "response", "domain"} lines, in order met."""
    names: list[str] = []
    from sempar.prompt import prompt_text

    for p in files:
        with open(p, "rb") as f:
            while raw := f.readline(RESPONSE_LINE_BYTES_MAX + 1):
                if b'"domain"' not in raw or len(raw) > RESPONSE_LINE_BYTES_MAX:
                    continue                     # the main pass names a bad line
                try:
                    obj = parse_json(raw, str(p), RESPONSE_LINE_BYTES_MAX)
                except InputError:
                    continue
                d = obj.get("domain") if isinstance(obj, dict) and "response" in obj else None
                if d is not None and (not isinstance(d, str) or not d):
                    raise InputError(f"{p}: domain {str(d)[:40]!r} is not a non-empty string")
                if d is not None:
                    prompt_text(d, f"{p}: domain", InputError)
                if d is not None and d not in names:
                    names.append(d)
    return names
