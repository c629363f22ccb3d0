"""The invariants of a trace's arrays, checked block by block (a whole trace, or one row group).

Each check raises `InputError` naming the field, the row (in the file: `row_offset` added), and
the value: shapes and integer dtypes, token ids below the vocabulary, non-negative request ids
and positions, expert ids in range and distinct within a top-k, group-limited routing within
`topk_groups`, domain indices that name a domain, finite non-negative weights, and the optional
prefill / decode column. Array shapes are those of `sempar.trace.schema.RoutingTrace`; `meta`
is its `TraceMeta` (not imported: the schema calls these checks).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sempar.errors import InputError


def check_decode(decode: np.ndarray | None, T: int) -> None:
    """The optional prefill / decode column: bool[T] (None: not known)."""
    if decode is not None and (decode.shape != (T,) or decode.dtype != np.bool_):
        raise InputError(f"decode: shape {decode.shape} dtype {decode.dtype}, expected bool[{T}]")


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


# Rows per pass of the top-k checks: bounds their temporaries (k sorted copies of the slot
# columns) to a few MB whatever the trace's size.
_CHECK_ROWS = 8192
# Up to this k the slots are sorted by a comparator network on whole columns (vectorised
# min/max); np.sort along a length-k axis pays a per-row call and is ~5x slower for k = 8.
_NETWORK_MAX_K = 32


def sort_network(n: int) -> list[tuple[int, int]]:
    """Comparators (i, j), i < j, of Batcher's odd-even merge sort for n inputs, in order:
    applying `a[i], a[j] = min, max` for each sorts any a[0:n] (Knuth, TAOCP vol. 3, 5.3.4)."""
    pairs = []
    p = 1
    while p < n:
        step = p
        while step >= 1:
            for j in range(step % p, n - step, 2 * step):
                for i in range(min(step, n - j - step)):
                    if (i + j) // (2 * p) == (i + j + step) // (2 * p):
                        pairs.append((i + j, i + j + step))
            step //= 2
        p *= 2
    return pairs


def sorted_slots(experts: np.ndarray) -> list[np.ndarray]:
    """experts int[T, L, k] -> k arrays int[T, L]: the slots of each (row, layer) sorted
    ascending (column c holds the c-th smallest id)."""
    k = experts.shape[2]
    if k > _NETWORK_MAX_K:
        srt = np.sort(experts, axis=2)
        return [srt[:, :, c] for c in range(k)]
    cols = [np.ascontiguousarray(experts[:, :, c]) for c in range(k)]
    for i, j in sort_network(k):
        low = np.minimum(cols[i], cols[j])
        np.maximum(cols[i], cols[j], out=cols[j])
        cols[i] = low
    return cols


def _check_topk(meta: Any, experts: np.ndarray, row0: int, grouped: bool) -> None:
    """No expert twice in a (row, layer)'s top-k; with group-limited routing, at most
    meta.topk_groups groups per top-k. experts: int[T, L, k], k > 1, ids already in range."""
    cols = sorted_slots(experts)
    dup = np.zeros(cols[0].shape, bool)
    for a, b in zip(cols, cols[1:]):
        dup |= a == b
    if dup.any():
        r, l = _first_bad(dup)
        raise InputError(f"experts: row {r + row0} layer {l}: duplicate expert in top-k "
                         f"{experts[r, l].tolist()}")
    if not grouped:
        return
    # Group ids are a monotone function of expert ids, so they come out sorted too; a shift
    # when the group size is a power of two (DeepSeek-V3: 32) is several times cheaper than a
    # division on the whole column.
    per_group = int(meta.num_experts // meta.num_expert_groups)   # meta may hold np.integer
    shift = per_group.bit_length() - 1
    group = (lambda c: c >> shift) if per_group == 1 << shift else (lambda c: c // per_group)
    n_groups = np.ones(cols[0].shape, np.int16)   # k <= SHAPE_LIMITS["top_k"] fits int16
    prev = group(cols[0])
    for c in cols[1:]:
        g = group(c)
        n_groups += prev != g
        prev = g
    bad = n_groups > meta.topk_groups
    if bad.any():
        r, l = _first_bad(bad)
        raise InputError(f"experts: row {r + row0} layer {l}: top-k {experts[r, l].tolist()} "
                         f"spans {int(n_groups[r, l])} expert groups, more than "
                         f"metadata.topk_groups {meta.topk_groups}")


def validate_arrays(meta: Any, token_id: np.ndarray, request_id: np.ndarray,
                    position: np.ndarray, experts: np.ndarray, domain: np.ndarray | None,
                    domains: Sequence[str], weights: np.ndarray | None,
                    row_offset: int = 0) -> None:
    """Validate one block of trace rows (a whole trace, or one Parquet row group).

    `row_offset` is added to reported row numbers so that errors name the row in the file.
    Raises `InputError` with "field: row R ...: value V ..." on the first violation found.
    """
    T = token_id.shape[0]
    L, N, k = meta.num_layers, meta.num_experts, meta.top_k
    for name, arr in (("token_id", token_id), ("request_id", request_id), ("position", position)):
        if arr.ndim != 1 or arr.shape[0] != T:
            raise InputError(f"{name}: shape {arr.shape} does not match {T} tokens")
        if not np.issubdtype(arr.dtype, np.integer):
            raise InputError(f"{name}: dtype {arr.dtype} is not an integer type")
    if experts.ndim != 3 or experts.shape[0] != T:
        raise InputError(f"experts: shape {experts.shape} is not (tokens={T}, layers, top_k)")
    if experts.shape[1] != L:
        raise InputError(f"experts: {experts.shape[1]} layers but metadata.num_layers is {L}")
    if experts.shape[2] != k:
        raise InputError(f"experts: top-k of {experts.shape[2]} but metadata.top_k is {k}")
    if not np.issubdtype(experts.dtype, np.integer):
        raise InputError(f"experts: dtype {experts.dtype} is not an integer type")
    bad = (token_id < 0) | (token_id >= meta.vocab_size)
    if bad.any():
        r = _first_bad(bad)[0]
        raise InputError(f"token_id: row {r + row_offset}: value {int(token_id[r])} out of range "
                         f"[0, {meta.vocab_size})")
    for name, arr in (("request_id", request_id), ("position", position)):
        bad = arr < 0
        if bad.any():
            r = _first_bad(bad)[0]
            raise InputError(f"{name}: row {r + row_offset}: value {int(arr[r])} is negative")
    # min / max first: one pass each, no boolean temporaries of the block's size
    bad = (experts < 0) | (experts >= N) if experts.size and (
        experts.min() < 0 or experts.max() >= N) else None
    if bad is not None:
        r, l, s = _first_bad(bad)
        raise InputError(f"experts: row {r + row_offset} layer {l} slot {s}: expert id "
                         f"{int(experts[r, l, s])} out of range [0, {N})")
    grouped = meta.topk_groups < meta.num_expert_groups
    for lo in range(0, T, _CHECK_ROWS) if k > 1 else ():
        _check_topk(meta, experts[lo:lo + _CHECK_ROWS], row_offset + lo, grouped)
    if domain is not None:
        if domain.shape != (T,):
            raise InputError(f"domain: shape {domain.shape} does not match {T} tokens")
        bad = (domain < -1) | (domain >= len(domains))
        if bad.any():
            r = _first_bad(bad)[0]
            raise InputError(f"domain: row {r + row_offset}: index {int(domain[r])} names no domain "
                             f"(known: {list(domains)})")
    if weights is not None:
        if weights.shape != experts.shape:
            raise InputError(f"weights: shape {weights.shape} differs from experts {experts.shape}")
        # a NaN makes min() NaN (not >= 0), an infinity makes max() infinite
        ok = not weights.size or (weights.min() >= 0 and np.isfinite(weights.max()))
        if not ok:
            r, l, s = _first_bad(~np.isfinite(weights) | (weights < 0))
            raise InputError(f"weights: row {r + row_offset} layer {l} slot {s}: value "
                             f"{float(weights[r, l, s])} is not a finite non-negative number")
