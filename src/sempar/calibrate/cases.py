"""The shapes `sempar calibrate` measures: per model, the blocks the serving forecast prices
(accel_profile.py), on grids of tokens (and contexts) that cover decode and prefill batches.

Grids (`Grid`): `full` (the shipped profile's), `quick` (a third of the points, for a short
device slot) and `cpu` (tiny, so CI runs the code path in seconds). MoE blocks are measured for
each EP size in `eps` (experts per rank = ceil(N / EP)); attention decode for batches x
contexts with batch x context <= `max_kv_tokens` (the KV cache one case allocates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sempar.serving.dims import ModelDims


@dataclass(frozen=True)
class Grid:
    moe_tokens: tuple[int, ...]
    eps: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    prefill_chunks: tuple[int, ...]
    prefill_contexts: tuple[int, ...]
    head_tokens: tuple[int, ...]
    max_kv_tokens: int


GRIDS = {
    "full": Grid((8, 32, 128, 512, 2048, 8192, 32768), (4, 8), (1, 4, 16, 64, 256),
                 (512, 2048, 8192), (512, 2048), (2048, 8192), (1, 16, 64, 256, 2048), 1 << 20),
    "quick": Grid((8, 512, 8192), (8,), (1, 16, 256), (1024, 4096), (2048,), (2048,),
                  (1, 256, 2048), 1 << 20),
    "cpu": Grid((8, 64), (4,), (1, 4), (64, 256), (32,), (64,), (1, 16), 1 << 12),
}


def cases(models: list[ModelDims], grid: Grid) -> list[dict]:
    """Measured points without times: {op, model, dims, tokens, experts_per_rank | phase,
    context}, in a stable order (model by model, so one model's weights are built together)."""
    out: list[dict] = []
    for d in models:
        base = {"model": d.name, "dims": d}
        Es = sorted({math.ceil(d.num_experts / ep) for ep in grid.eps if ep <= d.num_experts})
        for E in Es:
            out += [{**base, "op": "moe_block", "experts_per_rank": E, "tokens": T}
                    for T in grid.moe_tokens]
        for C in grid.decode_contexts:
            out += [{**base, "op": "attention", "phase": "decode", "context": C, "tokens": B}
                    for B in grid.decode_batches if B * C <= grid.max_kv_tokens]
        for C in grid.prefill_contexts:
            out += [{**base, "op": "attention", "phase": "prefill", "context": C, "tokens": n}
                    for n in grid.prefill_chunks]
        out += [{**base, "op": "lm_head", "tokens": n} for n in grid.head_tokens]
        if d.dense_layers and d.dense_intermediate:
            out += [{**base, "op": "dense_mlp", "tokens": n} for n in grid.head_tokens]
    return out
