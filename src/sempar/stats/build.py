"""Building `RoutingStats` from trace blocks: one shard streamed row group by row group.

`StatsBuilder.add` takes one block of rows (what `trace.io.iter_blocks` yields: token_id
int[n], request_id int[n], position int[n], experts int[n, L, k], domain int16[n] or absent)
and keeps only sums and the sample's candidate rows, so a shard is never whole in memory:

- loads: one bincount per layer;
- tokens: blocks are held until a chunk of `chunk_ids` expert ids (about `CHUNK_IDS` bytes
  of uint8 ids), then counted in one pass per layer (`chunk_token_counts`): the chunk's rows
  are ordered by token id once (shared by every layer; each layer's ids gathered in that
  order from the held blocks, no sorted copy of the chunk), each layer's int32 keys
  rank(token) x N + expert are then sorted in runs (a stable sort merges them) and the
  distinct keys with their run lengths are the layer's (token, expert) counts, as CSR [V, N]
  added to the running table (a linear merge; int32 counts while the rows fit,
  `sketch.count_dtype`), which is then cut back to at most
  `token_cells` cells a layer (`stats.sketch`: a Misra-Gries summary with a stated error
  bound; exact while it fits). Beside the tables, each token's exact occurrence count.
  Why not a bincount over the chunk's distinct
  tokens x N cells (the first version, per block): a chunk touches ~10 of the N = 256 experts
  per token and layer, so the cells outnumber the ids 4-15x, and scanning them cost 3-4x the
  sort on DeepSeek-V3-shape traces (`benchmarks/bench_stats.py`);
- coactivation / transitions: bincounts over the (e, f) pair keys of each row;
- request-experts: per layer bincounts over (request, expert) keys of the block;
- sample: the rows of the requests that can still be in the shard's sample. The running cut
  (`stats.sample`: the first request whose prefix passes `sample_rows` on the rows seen so
  far) only moves down as rows arrive, so a request past it is dropped for good; the exact
  rule is applied once the shard ends.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
from scipy import sparse

from sempar.stats.sample import bottom_requests, cut_after, request_priority
from sempar.stats.routing_stats import SAMPLE_COLUMNS, RoutingStats
from sempar.stats.sketch import TOKEN_CELLS, add_reduce, count_dtype
from sempar.trace.schema import TraceMeta

CHUNK_IDS = 1 << 28      # expert ids per token-count chunk (uint8: 256 MiB; 580k DSv3 rows)


def chunk_token_counts(tok: np.ndarray, blocks: list[np.ndarray], V: int, N: int,
                       dtype=np.int64) -> Iterator[sparse.csr_matrix]:
    """Layer by layer, the (token, expert) counts of a chunk of rows as canonical CSR [V, N]
    of `dtype` counts (module docstring): tok int[n] the rows' token ids, blocks the rows'
    experts int[n_i, L, k] in order (sum of n_i = n).

    The rows are sorted by token id once; each layer's ids are gathered from the blocks in
    that order (an [n, k] copy a layer), never a sorted copy of the whole chunk (it was the
    build's largest array beside the blocks: 512 MiB of uint16 ids at the default chunk). A
    generator, so
    that a layer's counts are merged and dropped before the next layer's are made: the
    chunk's tables of every layer at once were 0.45 GB beside the running tables on 580k
    DeepSeek-V3-shape rows."""
    order = np.argsort(tok, kind="stable")
    ut, cnt = np.unique(tok[order], return_counts=True)
    U, k = ut.size, blocks[0].shape[2]
    slot_rank = np.repeat(np.arange(U, dtype=np.int32), cnt * k)    # rank of each id's token
    row_nnz_at = np.zeros(V + 1, np.int64)
    for l in range(blocks[0].shape[1]):
        e = np.concatenate([b[:, l] for b in blocks])[order].ravel()
        # stable counting sort by expert (numpy's radix sort for uint8): within an expert
        # the ids stay in token order, so equal (expert, token) pairs are adjacent
        p = np.argsort(e, kind="stable")
        r, es = slot_rank[p], e[p]
        del p
        first = np.empty(r.size, bool)
        first[0] = True
        np.not_equal(r[1:], r[:-1], out=first[1:])
        first[1:] |= es[1:] != es[:-1]
        at = np.flatnonzero(first)
        val = np.diff(np.append(at, r.size)).astype(dtype)
        # expert-major [N, U] is canonical as built; its transpose as CSR is token-major
        em = np.zeros(N + 1, np.int64)
        np.cumsum(np.bincount(es[at], minlength=N), out=em[1:])
        tm = sparse.csr_matrix((val, r[at], em), shape=(N, U)).T.tocsr()
        row_nnz_at[1:] = 0
        row_nnz_at[1:][ut] = np.diff(tm.indptr)
        indptr = np.cumsum(row_nnz_at).astype(tm.indptr.dtype)
        yield sparse.csr_matrix((tm.data, tm.indices, indptr), shape=(V, N))


def _pair_counts(a: np.ndarray, b: np.ndarray, N: int) -> np.ndarray:
    """int64[N, N]: for rows selecting experts a int[n, k] and b int[n, k'], the number of
    rows with e in a and f in b, summed over all (e, f) slot pairs."""
    key = (a.astype(np.int64)[:, :, None] * N + b.astype(np.int64)[:, None, :]).ravel()
    return np.bincount(key, minlength=N * N).reshape(N, N)


class StatsBuilder:
    """Accumulates the blocks of one shard (module docstring) into a `RoutingStats`."""

    def __init__(self, meta: TraceMeta, domains: list[str], parts: tuple[str, ...], seed: int,
                 sample_rows: int, name: str, chunk_ids: int = CHUNK_IDS,
                 token_cells: int = TOKEN_CELLS):
        self.meta, self.domains, self.parts = meta, list(domains), tuple(parts)
        self.token_cells = token_cells
        self.seed, self.sample_rows, self.name = seed, sample_rows, name
        L, N = meta.num_layers, meta.num_experts
        self.L, self.N, self.V = L, N, meta.vocab_size
        self.rows = 0
        self.loads = np.zeros((L, N), np.int64)
        self._req_ids = np.zeros(0, np.int64)
        self._req_rows = np.zeros(0, np.int64)
        self._chunk_ids = chunk_ids
        self._tok_pending: list[tuple[np.ndarray, np.ndarray]] = []    # (token_id, experts)
        self._tok_pending_ids = 0
        self._tokens = ([sparse.csr_matrix((self.V, N), dtype=np.int32) for _ in range(L)]
                        if "tokens" in parts else None)
        self._token_error = np.zeros(L, np.int64)
        self._occurrences = np.zeros(self.V, np.int64) if "tokens" in parts else None
        self.coactivation = np.zeros((L, N, N), np.int64) if "coactivation" in parts else None
        self.transitions = (np.zeros((max(L - 1, 0), N, N), np.int64)
                            if "transitions" in parts else None)
        self._rq: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in range(L)]
        self._sample: list[dict[str, np.ndarray]] = []
        self._cut: tuple[int, int] | None = None
        self._has_domain = False

    # -- one block --------------------------------------------------------------------------
    def add(self, arrays: dict[str, np.ndarray]) -> None:
        """Count one block of rows (module docstring); rows follow the previous block's."""
        tok = np.asarray(arrays["token_id"], np.int64)
        req = np.asarray(arrays["request_id"], np.int64)
        ex = arrays["experts"]
        n = tok.size
        if n == 0:
            return
        ids, inv, cnt = np.unique(req, return_inverse=True, return_counts=True)
        self._add_requests(ids, cnt)
        for l in range(self.L):
            e = ex[:, l].astype(np.int64)
            self.loads[l] += np.bincount(e.ravel(), minlength=self.N)
            if self.coactivation is not None:
                self.coactivation[l] += _pair_counts(e, e, self.N)
            if self.transitions is not None and l + 1 < self.L:
                self.transitions[l] += _pair_counts(e, ex[:, l + 1], self.N)
            if "request-experts" in self.parts:
                key = (inv[:, None] * self.N + e).ravel()
                c = np.bincount(key, minlength=ids.size * self.N)
                nz = np.flatnonzero(c)
                self._rq[l].append((ids[nz // self.N], nz % self.N, c[nz]))
        if self._tokens is not None:
            self._add_tokens(tok, ex)
        if "sample" in self.parts:
            self._add_sample(arrays, n)
        self.rows += n

    def _add_requests(self, ids: np.ndarray, cnt: np.ndarray) -> None:
        allid = np.concatenate([self._req_ids, ids])
        allrows = np.concatenate([self._req_rows, cnt])
        self._req_ids, where = np.unique(allid, return_inverse=True)
        self._req_rows = np.bincount(where, weights=allrows, minlength=self._req_ids.size
                                     ).astype(np.int64)

    def _add_tokens(self, tok: np.ndarray, ex: np.ndarray) -> None:
        # copies: the block's arrays may be views of Arrow buffers that are reused; the ids
        # held as uint8 where the experts fit (traces store them as uint16: DeepSeek-V3's
        # 2^28-id chunk was 512 MiB of held blocks, now 256 MiB)
        small = np.uint8 if self.N <= 256 else ex.dtype
        self._tok_pending.append((tok.copy(), ex.astype(small, copy=True)))
        self._tok_pending_ids += ex.size
        self._occurrences += np.bincount(tok, minlength=self.V)
        if self._tok_pending_ids >= self._chunk_ids:
            self._flush_tokens()

    def _flush_tokens(self) -> None:
        if not self._tok_pending:
            return
        tok = np.concatenate([p[0] for p in self._tok_pending])
        blocks = [p[1] for p in self._tok_pending]
        self._tok_pending, self._tok_pending_ids = [], 0
        dtype = count_dtype(self.rows + tok.size)     # >= the rows the tables count so far
        for l, m in enumerate(chunk_token_counts(tok, blocks, self.V, self.N, dtype)):
            self._tokens[l], t = add_reduce(self._tokens[l], m, self.token_cells, dtype)
            self._token_error[l] += t
            del m

    def _add_sample(self, arrays: dict[str, np.ndarray], n: int) -> None:
        blk = {"row": np.arange(self.rows, self.rows + n, dtype=np.int64),
               "token_id": np.asarray(arrays["token_id"]),
               "request_id": np.asarray(arrays["request_id"], np.int64),
               "position": np.asarray(arrays["position"]),
               "experts": np.ascontiguousarray(arrays["experts"])}
        if arrays.get("domain") is not None:
            blk["domain"] = np.asarray(arrays["domain"])
            self._has_domain = True
        prio = request_priority(self._req_ids, self.seed)
        chosen = bottom_requests(prio, self._req_ids, self._req_rows, self.sample_rows)
        keep_ids = self._req_ids[chosen]
        mask = np.isin(blk["request_id"], keep_ids)
        if mask.any():
            self._sample.append({k: v[mask] for k, v in blk.items()})
        held = sum(s["row"].size for s in self._sample)
        if held > 2 * self.sample_rows + n:              # prune the requests now past the cut
            self._sample = [{k: v[m] for k, v in s.items()}
                            for s in self._sample
                            if (m := np.isin(s["request_id"], keep_ids)).any()]

    # -- the shard's stats -------------------------------------------------------------------
    def finish(self) -> RoutingStats:
        """The shard's `RoutingStats` (exact sample rule applied, sums flushed)."""
        out = RoutingStats(self.meta, self.domains, self.parts, self.seed, self.sample_rows,
                           [(self.name, self.rows)], self.loads, self._req_ids, self._req_rows,
                           coactivation=self.coactivation, transitions=self.transitions,
                           token_cells=self.token_cells)
        if self._tokens is not None:
            self._flush_tokens()
            out.tokens, out.token_error = self._tokens, self._token_error
            out.token_occurrences = self._occurrences
        if "request-experts" in self.parts:
            out.request_experts = [self._request_table(l) for l in range(self.L)]
        if "sample" in self.parts:
            out.sample, out.sample_cut = self._final_sample()
        return out

    def _request_table(self, l: int) -> sparse.csr_matrix:
        parts = self._rq[l]
        rid = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        col = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        val = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
        r = np.searchsorted(self._req_ids, rid)
        m = sparse.csr_matrix((val.astype(np.int64), (r, col)),
                              shape=(self._req_ids.size, self.N))
        m.sum_duplicates()
        return m

    def _final_sample(self) -> tuple[dict[str, np.ndarray], tuple[int, int] | None]:
        prio = request_priority(self._req_ids, self.seed)
        chosen = bottom_requests(prio, self._req_ids, self._req_rows, self.sample_rows)
        keep = self._req_ids[chosen]
        cols = [c for c in SAMPLE_COLUMNS if c != "domain" or self._has_domain]
        # each held block cut to the kept rows and dropped before the next: concatenating the
        # candidates first held them twice beside the cut (up to 2 x sample_rows + a block
        # of DeepSeek-V3 rows, 0.4 GB, three times over at a shard's end)
        held = self._sample
        self._sample = []
        kept = [{c: held[0][c][:0] for c in cols}] if held else []   # dtypes when none kept
        while held:
            s = held.pop(0)
            m = np.isin(s["request_id"], keep)
            if m.any():
                kept.append({c: s[c][m] for c in cols})
            del s
        out = {c: np.concatenate([s.pop(c) for s in kept]) if kept else np.zeros(0, np.int64)
               for c in cols}
        return out, cut_after(prio, self._req_ids, chosen)
