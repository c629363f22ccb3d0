"""Every part of a loaded `RoutingStats` file checked against the counts it must agree with.

The file's SHA-256 (`stats.file`) has no key: it detects damage, and anyone who edits a file
can recompute it. So a file whose hash matches is still checked part by part before any
figure is read from it, each violation one line (`InputError`) naming the part:

- header: parts known and in `PARTS` order (token parts only with token ids), seed and
  sample size in range, shards [name, rows] with rows in [0, `TOKENS_MAX`], domains distinct
  strings, the sample cut a (uint64 priority, int64 id) pair, and no control character in a
  name the verbs print (model, shards, domains);
- the arrays are exactly those the parts hold, of the dtypes and shapes the writer gives;
- `loads` int64[L, N] non-negative, each layer summing to rows x k (every row selects k
  distinct experts per layer, so no sum overflows once rows x k x k < 2^62);
- requests: ids strictly increasing, each request's rows >= 1, the rows summing to the shards';
- sample: rows strictly increasing in [0, rows), the columns a valid trace block
  (`trace.validate.validate_arrays`: expert ids in range and distinct, token ids below the
  vocabulary, domains known), whole requests of the request table, and exactly the requests
  the sample rule (`stats.sample`) picks below the file's cut;
- token / request-expert tables: canonical CSR (indptr from 0, non-decreasing; column
  indices in [0, N), strictly increasing in a row; counts > 0), column sums equal to `loads`,
  row sums multiples of k (tokens) or equal to the request's rows x k (request-experts);
  token tables also: occurrences int64[V] summing to the rows, no count above its token's
  occurrences, row sums k x occurrences; a capped layer (`stats.sketch`: error > 0) instead
  at most `token_cells` cells, column sums <= `loads`, row sums <= k x occurrences, and its
  error within the bound k x rows / (token_cells + 1);
- co-activation int64[L, N, N]: symmetric, its diagonal `loads`, row sums loads x k;
  transitions int64[L-1, N, N]: row sums loads[l] x k, column sums loads[l+1] x k.
"""

from __future__ import annotations

import re

import numpy as np
from scipy import sparse

from sempar.bounds import SEED_MAX, TOKENS_MAX
from sempar.errors import InputError
from sempar.stats.parts import PARTS, STATS_PARTS
from sempar.stats.routing_stats import RoutingStats
from sempar.stats.sample import below, bottom_requests, request_priority

ROWS_K2_MAX = 1 << 62      # rows x k x k: every count and sum below fits int64


def _int(value, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(f"the stats header's {name} {value!r} is not an integer in [{lo}, {hi}]")
    return value


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _plain(value: str, name: str) -> None:
    """Names the verbs print (model, shards, domains) hold no control characters: an escape
    sequence in a forged file would reach the user's terminal."""
    if _CONTROL.search(value):
        raise InputError(f"the stats header's {name} {ascii(value[:40])} holds control characters")


def check_header(header: dict) -> None:
    """The header's fields beside `meta` (module docstring); one line on the first bad one."""
    meta = header.get("meta")
    if isinstance(meta, dict):
        for key in ("model", "model_type"):
            if isinstance(meta.get(key), str):
                _plain(meta[key], key)
    parts = header.get("parts")
    if not isinstance(parts, list) or any(not isinstance(p, str) for p in parts):
        raise InputError("the stats header's parts is not a list of names")
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise InputError(f"the stats header names an unknown part {bad[0]!r}")
    if parts != [p for p in PARTS if p in parts]:
        raise InputError(f"the stats header's parts {parts} are repeated or out of order")
    _int(header.get("seed"), "seed", 0, SEED_MAX)
    _int(header.get("sample_rows"), "sample_rows", 1, TOKENS_MAX)
    shards = header.get("shards")
    if not isinstance(shards, list) or not shards:
        raise InputError("the stats header's shards is not a non-empty list")
    for s in shards:
        if not (isinstance(s, list) and len(s) == 2 and isinstance(s[0], str)):
            raise InputError(f"the stats header's shard {s!r} is not [name, rows]")
        _int(s[1], "shard rows", 0, TOKENS_MAX)
        _plain(s[0], "shard name")
    domains = header.get("domains")
    if not isinstance(domains, list) or any(not isinstance(d, str) for d in domains) \
            or len(set(domains)) != len(domains):
        raise InputError("the stats header's domains is not a list of distinct names")
    for d in domains:
        _plain(d, "domain")
    if header.get("version", 1) >= 2:
        _int(header.get("token_cells"), "token_cells", 0, TOKENS_MAX)
    cut = header.get("sample_cut")
    if cut is not None:
        if not (isinstance(cut, list) and len(cut) == 2):
            raise InputError(f"the stats header's sample_cut {cut!r} is not [priority, id]")
        _int(cut[0], "sample_cut priority", 0, 2**64 - 1)
        _int(cut[1], "sample_cut request id", -2**63, 2**63 - 1)


def check_arrays(arrays: dict[str, np.ndarray], parts: list[str], L: int,
                 version: int = 2) -> None:
    """The file holds exactly the arrays of its parts, of the writer's dtypes (module docstring);
    `version` of the file format (`stats.file`: 1 has no token error or occurrences)."""
    want = {"loads", "request_ids", "request_rows"}
    tables = [p for p in ("tokens", "request_experts") if p.replace("_", "-") in parts]
    for t in tables:
        want |= {f"{t}.indptr", f"{t}.indices", f"{t}.data", f"{t}.offsets"}
    if "tokens" in tables and version >= 2:
        want |= {"tokens.error", "tokens.occurrences"}
    for p in ("coactivation", "transitions"):
        if p in parts:
            want.add(p)
    sample = {k for k in arrays if k.startswith("sample.")}
    if "sample" in parts:
        need = {f"sample.{c}" for c in ("row", "token_id", "request_id", "position", "experts")}
        missing = sorted(need - sample)
        if missing:
            raise InputError(f"the stats file misses the array {missing[0]!r}")
        want |= need | ({"sample.domain"} & sample)
    extra, missing = sorted(set(arrays) - want), sorted(want - set(arrays))
    if missing:
        raise InputError(f"the stats file misses the array {missing[0]!r}")
    if extra:
        raise InputError(f"the stats file holds an array {extra[0]!r} its parts do not name")
    for name, a in arrays.items():
        if not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"the stats array {name!r} has dtype {a.dtype}, not integers")
        if name.endswith(".indices") and a.dtype != np.int32 or \
                not name.endswith(".indices") and not name.startswith("sample.") \
                and a.dtype != np.int64:
            raise InputError(f"the stats array {name!r} has dtype {a.dtype}")


def _nonneg_sum(a: np.ndarray, axis, what: str) -> np.ndarray:
    """Exact int64 sums of a non-negative int64 array, refused before they could overflow."""
    if a.size and a.min() < 0:
        raise InputError(f"the stats file's {what} holds a negative count ({int(a.min())})")
    if a.size and float(a.sum(dtype=np.float64)) >= ROWS_K2_MAX:
        raise InputError(f"the stats file's {what} sums past 2^62")
    return a.sum(axis=axis, dtype=np.int64)


def _counts(stats: RoutingStats) -> None:
    m, rows = stats.meta, stats.rows
    L, N, k = m.num_layers, m.num_experts, m.top_k
    if rows * k * k >= ROWS_K2_MAX:
        raise InputError(f"the stats file's {rows} rows x top-k {k} squared pass 2^62")
    if stats.loads.shape != (L, N):
        raise InputError(f"the stats file's loads have shape {stats.loads.shape}, not ({L}, {N})")
    per_layer = _nonneg_sum(stats.loads, 1, "loads")
    if (per_layer != rows * k).any():
        l = int(np.flatnonzero(per_layer != rows * k)[0])
        raise InputError(f"the stats file's loads of layer {l} sum to {int(per_layer[l])}, not "
                         f"rows x top-k = {rows * k}")
    ids, rr = stats.request_ids, stats.request_rows
    if ids.ndim != 1 or rr.shape != ids.shape:
        raise InputError(f"the stats file's request ids {ids.shape} and rows {rr.shape} differ")
    if ids.size > 1 and (np.diff(ids) <= 0).any():
        raise InputError("the stats file's request ids are not strictly increasing")
    if rr.size and rr.min() < 1:
        raise InputError(f"the stats file gives a request {int(rr.min())} rows")
    if int(_nonneg_sum(rr, None, "request rows")) != rows:
        raise InputError(f"the stats file's request rows do not sum to its {rows} shard rows")


def _pairs(stats: RoutingStats) -> None:
    L, N, k = stats.meta.num_layers, stats.meta.num_experts, stats.meta.top_k
    loads = stats.loads
    co = stats.coactivation
    if co is not None:
        if co.shape != (L, N, N):
            raise InputError(f"the stats file's coactivation has shape {co.shape}, not "
                             f"({L}, {N}, {N})")
        rs = _nonneg_sum(co, 2, "coactivation")
        if (co != co.transpose(0, 2, 1)).any() or \
                (np.diagonal(co, axis1=1, axis2=2) != loads).any() or (rs != loads * k).any():
            raise InputError("the stats file's coactivation disagrees with its loads")
    tr = stats.transitions
    if tr is not None:
        if tr.shape != (max(L - 1, 0), N, N):
            raise InputError(f"the stats file's transitions have shape {tr.shape}, not "
                             f"({max(L - 1, 0)}, {N}, {N})")
        rs, cs = _nonneg_sum(tr, 2, "transitions"), tr.sum(axis=1, dtype=np.int64)
        if (rs != loads[:-1] * k).any() or (cs != loads[1:] * k).any():
            raise InputError("the stats file's transitions disagree with its loads")


def _table(t: sparse.csr_matrix, what: str, rows_want: int, N: int) -> np.ndarray:
    """Check one canonical CSR count table; its int64 row sums."""
    if t.shape != (rows_want, N):
        raise InputError(f"the stats file's {what} has shape {t.shape}, not ({rows_want}, {N})")
    ip, ind, data = t.indptr, t.indices, t.data
    if ip[0] != 0 or (np.diff(ip) < 0).any() or ip[-1] != ind.size:
        raise InputError(f"the stats file's {what} row pointers are not a CSR's")
    if ind.size and (ind.min() < 0 or ind.max() >= N):
        raise InputError(f"the stats file's {what} names an expert outside [0, {N})")
    if data.size and data.min() < 1:
        raise InputError(f"the stats file's {what} holds a count below 1")
    step = np.diff(ind)
    starts = np.zeros(ind.size, bool)
    starts[ip[:-1][ip[:-1] < ind.size]] = True
    if ind.size > 1 and ((step <= 0) & ~starts[1:]).any():
        raise InputError(f"the stats file's {what} repeats or unsorts an expert in a row")
    _nonneg_sum(data, None, what)
    return np.asarray(t.sum(axis=1, dtype=np.int64)).ravel()


def _tables(stats: RoutingStats) -> None:
    m = stats.meta
    L, N, k = m.num_layers, m.num_experts, m.top_k
    if stats.tokens is not None:
        _token_extras(stats)
    for name, tables, nrows in (("tokens", stats.tokens, m.vocab_size),
                                ("request-experts", stats.request_experts,
                                 stats.request_ids.size)):
        if tables is None:
            continue
        if len(tables) != L:
            raise InputError(f"the stats file has {len(tables)} {name} tables for {L} layers")
        for l, t in enumerate(tables):
            what = f"{name} table of layer {l}"
            rs = _table(t, what, nrows, N)
            cols = np.asarray(t.sum(axis=0, dtype=np.int64)).ravel()
            if name == "tokens":
                _token_table(stats, l, t, rs, cols, what)
                continue
            if (cols != stats.loads[l]).any():
                raise InputError(f"the stats file's {what} disagrees with its loads")
            if (rs != stats.request_rows * k).any():
                raise InputError(f"the stats file's {what} disagrees with its request sizes")


def _token_extras(stats: RoutingStats) -> None:
    from sempar.stats.sketch import bound

    L, V = stats.meta.num_layers, stats.meta.vocab_size
    err, occ = stats.token_error, stats.token_occurrences
    if err is None or occ is None or err.shape != (L,) or occ.shape != (V,):
        raise InputError(f"the stats file's token error / occurrences are not int64[{L}] / "
                         f"int64[{V}]")
    if occ.min(initial=0) < 0 or int(occ.sum()) != stats.rows:
        raise InputError("the stats file's token occurrences do not sum to its rows")
    if err.min(initial=0) < 0 or err.max(initial=0) > bound(stats.token_cells, stats.meta.top_k,
                                                            stats.rows):
        raise InputError("the stats file's token error is outside its cap's bound")


def _token_table(stats: RoutingStats, l: int, t: sparse.csr_matrix, rs: np.ndarray,
                 cols: np.ndarray, what: str) -> None:
    """Layer l's token table against its loads and the tokens' occurrences (exact when its
    error is 0, else a Misra-Gries summary: counts only read low, `stats.sketch`)."""
    k, occ = stats.meta.top_k, stats.token_occurrences
    # a token seen n times selected each expert at most n times, k in all per time
    if (t.data > np.repeat(occ, np.diff(t.indptr))).any():
        raise InputError(f"the stats file's {what} counts an expert above its token's "
                         f"occurrences")
    if stats.token_error[l] == 0:
        if stats.token_cells and t.nnz > stats.token_cells:
            raise InputError(f"the stats file's {what} holds more cells than its cap")
        if (cols != stats.loads[l]).any():
            raise InputError(f"the stats file's {what} disagrees with its loads")
        if (rs != k * occ).any():
            raise InputError(f"the stats file's {what} is not k selections per occurrence")
        return
    if t.nnz > stats.token_cells or (cols > stats.loads[l]).any() or (rs > k * occ).any():
        raise InputError(f"the stats file's {what} holds more than its capped counts can")


def _sample(stats: RoutingStats) -> None:
    from sempar.trace.validate import validate_arrays

    s = stats.sample
    if s is None:
        return
    S = s["row"].shape[0] if s["row"].ndim == 1 else -1
    if S < 0 or any(v.shape[:1] != (S,) for v in s.values()):
        raise InputError("the stats file's sample columns differ in length")
    row = s["row"]
    if S and (row[0] < 0 or row[-1] >= stats.rows or (np.diff(row) <= 0).any()):
        raise InputError(f"the stats file's sample rows are not increasing in [0, {stats.rows})")
    try:
        validate_arrays(stats.meta, s["token_id"], s["request_id"], s["position"], s["experts"],
                        s.get("domain"), stats.domains, None)
    except InputError as err:
        raise InputError(f"the stats file's sample: {err}") from None
    ids, rr = stats.request_ids, stats.request_rows
    got, cnt = np.unique(s["request_id"], return_counts=True)
    at = np.searchsorted(ids, got)
    if (at >= ids.size).any() or (ids[np.minimum(at, ids.size - 1)] != got).any() \
            or (rr[np.minimum(at, ids.size - 1)] != cnt).any():
        raise InputError("the stats file's sample holds a request that is not whole or not in "
                         "its request table")
    prio = request_priority(ids, stats.seed)
    ok = np.flatnonzero(below(prio, ids, stats.sample_cut))
    chosen = ok[bottom_requests(prio[ok], ids[ok], rr[ok], stats.sample_rows)]
    if not np.array_equal(ids[chosen], got):
        raise InputError("the stats file's sample is not the requests its seed and cut pick")


def check_stats(stats: RoutingStats) -> RoutingStats:
    """Every part of `stats` (module docstring); one-line `InputError` on the first bad one.
    Linear in the file's size. Returns `stats`."""
    for p in stats.parts:
        if STATS_PARTS.get(p).needs_token_ids and not stats.meta.has_token_ids:
            raise InputError(f"the stats file holds the part {p!r} of a trace without token ids")
    _counts(stats)
    _pairs(stats)
    _tables(stats)
    _sample(stats)
    return stats
