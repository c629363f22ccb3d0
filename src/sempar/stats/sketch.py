"""The bounded token tables of `RoutingStats`: a Misra-Gries summary per layer.

A layer's token table counts, for every (token id u, expert e) cell, how many occurrences of
u selected e (Sem-MoE §3.2's activation table T^(l)). Its size grows with the distinct cells
of the trace (on 2M DeepSeek-V3-shape tokens: about 1.35M cells a layer, 0.63 GB for 58
layers as int32 counts in memory, `count_dtype`), so the table is kept as a Misra-Gries
frequent-items summary of the layer's stream of cells (Misra & Gries 1982, "Finding repeated elements"; merged as in Agarwal et al. 2012,
"Mergeable summaries", §3) with at most `cap` cells:

- reduce (`reduce_tables`): when a layer holds more than `cap` cells, t = the (cap + 1)-th
  largest count is subtracted from every cell and the cells left at <= 0 are dropped (at
  most `cap` remain). Building adds a chunk's exact counts to the running table then
  reduces; merging adds two summaries then reduces;
- error bound, per layer l: `error[l]` = the sum of every t subtracted on the way (through
  all shards and merges, tracked exactly and stored in the stats file). For every cell,
  true count - error[l] <= kept count <= true count (a dropped cell reads 0, so its true
  count is <= error[l]); and error[l] <= (W_l - kept mass) / (cap + 1) <= k x rows / (cap + 1)
  (each reduce by t removes at least (cap + 1) x t of mass, Agarwal et al. Lemma 1), so the
  bound does not grow with the number of shards or the merge order;
- exact when the cap is never reached: error 0 and the table is the exact one (cap 0: no cap).

What reads the tables (`placement.from_stats.TableCounts`) divides by each token's exact
occurrence count (kept beside the tables), so a token's device share at layer l is read low
by at most (N / G) x error[l] / (k x occurrences): only for rare tokens is it loose, and
they weigh little in the table's hit rate. Merge order matters only in which cells survive
(the bound holds for any); `stats.run` folds shards in the order given, locally and on Ray
alike, so both give the same tables.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

TOKEN_CELLS = 1 << 21      # default cap, cells a layer (DeepSeek-V3: 58 x 2^21 x 8 B = 0.97 GB)
INT32_ROWS = (1 << 31) - 1  # counts of at most this many rows fit int32


def count_dtype(rows: int) -> np.dtype:
    """The counts' dtype in memory for tables of `rows` rows in all: int32 while `rows` fits,
    else int64 (the stats file keeps int64 counts, `stats.file`, whatever the memory's).

    Why int32 is exact: a row adds 1 to at most one cell per (layer, expert) (its token's), so
    no cell, and no sum of two summaries' cells, exceeds the rows counted, and a reduce only
    lowers cells. In memory the tables are 8 B a cell (int32 counts, int32 column indices)
    instead of 12 B: on 20M DeepSeek-V3-shape tokens 0.81 GB instead of 1.21 GB."""
    return np.dtype(np.int32) if rows <= INT32_ROWS else np.dtype(np.int64)


def reduce_table(table: sparse.csr_matrix, cap: int) -> tuple[sparse.csr_matrix, int]:
    """(table', t): one Misra-Gries reduce of a layer's canonical CSR int[V, N] counts to at
    most `cap` cells (module docstring), of the table's dtype; t = 0 and `table` itself when
    it fits or cap is 0."""
    if cap <= 0 or table.nnz <= cap:
        return table, 0
    v = table.data
    t = int(np.partition(v, v.size - cap - 1)[v.size - cap - 1])
    keep = v > t
    row = np.repeat(np.arange(table.shape[0], dtype=np.int64), np.diff(table.indptr))[keep]
    indptr = np.zeros(table.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(row, minlength=table.shape[0]), out=indptr[1:])
    out = sparse.csr_matrix(((v[keep] - t).astype(v.dtype), table.indices[keep], indptr),
                            shape=table.shape)
    return out, t


def add_reduce(a: sparse.csr_matrix, b: sparse.csr_matrix, cap: int, dtype=None
               ) -> tuple[sparse.csr_matrix, int]:
    """(a + b reduced to `cap` cells, the t subtracted): summaries of two streams merged, the
    sum's counts of `dtype` (`count_dtype` of the rows both count; default: the wider of
    a's and b's)."""
    dtype = np.result_type(a.dtype, b.dtype) if dtype is None else np.dtype(dtype)
    a, b = (x if x.dtype == dtype else x.astype(dtype) for x in (a, b))   # before the sum
    s = b if a.nnz == 0 else (a if b.nnz == 0 else a + b)
    return reduce_table(s, cap)


def bound(cap: int, top_k: int, rows: int) -> int:
    """The a-priori bound on a layer's error: k x rows / (cap + 1) (0 without a cap)."""
    return 0 if cap <= 0 else (top_k * rows) // (cap + 1)
