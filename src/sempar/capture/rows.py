"""One engine response -> the trace rows of its request (`sempar capture` and the importers).

Rows are the positions [start, P + M - 1) of prompt (P tokens) + output (M tokens): the last
sampled token is never forwarded, so it has no routing. Row r holds position start + r, the
token (prompt + output)[start + r], and is a prefill row when its position < P, a decode row
after.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sempar.capture.engines import EngineSpec, Routed
from sempar.capture.payload import PayloadShape, moe_columns
from sempar.errors import InputError

# Tokens of one request (prompt + output) far beyond any served context (2M) and small enough
# that a hostile count cannot size an allocation: 2^24 rows x 61 layers x 8 x 4 B = 32 GB is
# the bound a forged count could ask for, so the payload's own length is checked against it.
REQUEST_TOKENS_MAX = 1 << 22


@dataclass
class RequestRows:
    """token_id int32[R], position int32[R], experts expert_dtype[R, L, k]; prompt_len P."""

    token_id: np.ndarray | None
    position: np.ndarray
    experts: np.ndarray
    prompt_len: int


def request_rows(spec: EngineSpec, routed: Routed, shape: PayloadShape, out_dtype: np.dtype,
                 what: str, prompt_ids: list[int] | None = None,
                 start: int | None = None) -> RequestRows:
    """Decode `routed` (one parsed response) into its rows; `prompt_ids` / `start` are what the
    request sent, when known (else the response's ids / the start inferred from the size)."""
    if routed.payload is None:
        raise InputError(f"{what}: the {spec.name} server returned no routed experts: start it "
                         f"with {spec.flag}")
    prompt = routed.prompt_ids if routed.prompt_ids is not None else prompt_ids
    if prompt is not None and prompt_ids is not None and list(prompt) != list(prompt_ids):
        raise InputError(f"{what}: the response's prompt token ids differ from the request's")
    P = len(prompt) if prompt is not None else routed.prompt_len
    if P < 0:
        raise InputError(f"{what}: no prompt token ids (neither in the response nor saved with "
                         "its request)")
    M = len(routed.output_ids)
    if M < 1:
        raise InputError(f"{what}: no output tokens (capture needs max_new_tokens >= 1)")
    if P + M > REQUEST_TOKENS_MAX:
        raise InputError(f"{what}: {P} prompt + {M} output tokens is above the limit "
                         f"{REQUEST_TOKENS_MAX}")
    start = routed.start if start is None else start
    full = P + M - 1
    if start is None:
        payload = spec.decode(routed.payload, None, shape, what, max_rows=full)
        start = full - payload.shape[0]
        if start > P:
            raise InputError(f"{what}: payload holds {payload.shape[0]} rows, fewer than the "
                             f"{M - 1} decode steps")
    else:
        if not 0 <= start <= P:
            raise InputError(f"{what}: routed-expert start {start} is not in [0, {P}]")
        payload = spec.decode(routed.payload, full - start, shape, what)
    experts = moe_columns(payload, shape, out_dtype, what)
    position = np.arange(start, full, dtype=np.int32)
    token_id = None
    if prompt is not None:
        seq = np.asarray(list(prompt) + list(routed.output_ids), dtype=np.int64)
        token_id = seq[start:full].astype(np.int32)
    return RequestRows(token_id, position, experts, P)
