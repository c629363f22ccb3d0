"""Affinity statistics of a trace (`AffinityStats` and the counts it is built from), one module for
placement, predict and analysis alike.

Functions of one layer's selections (experts int[T, k]) or of a whole trace (int[T, L, k]):

- `layer_counts(tok, experts, N)`: the non-zero (token, expert) counts, sparse and sorted
  (Sem-MoE §3.2's activation table T^(l); Cp is a row's counts over k x occurrences);
- `activation_counts(tok, experts, U, N)`: the same counts as a dense int32[U, N] table;
- `device_counts(experts, hosts_l)`: int32[T, G], how many of each token's experts device g hosts;
- `device_states(experts, hosts, ties)`: int16[T, L], each token's **device state** (Sem-MoE
  B.1, s-MoE B.1: "the device index where the chosen expert locates"): the device hosting the
  most of its k experts, an expert with replicas counting for every device that hosts it. One
  rule, ties to the lowest device id (`ties="lowest"`, what the token and n-gram tables are
  fitted and scored on); `ties="top1"` sends a tie to the device hosting the top-1 expert when
  it is among the tied (the expert-level analysis of `affinity.transitions`).

`AffinityStats`: the token-expert statistics of a fit trace for the co-clustering solvers.
Sem-MoE §3.2 / Alg. 1 and s-MoE App. B Alg. 1 work per MoE layer l on:

- `a` float64[U]: frequency of each distinct fit token (U tokens, sorted ids `tokens`);
- `counts(l)` [U, N]: c[u, e] = how many times token u selected expert e at layer l;
- `cp(l)` [U, N]: the token -> expert confidence Cp[l] = c / (k a) (each row sums to 1);
- `request_affinity(l)` float32[R, N]: Q[l] = B Cp[l], B[r, u] = occurrences of u in request r;
- `expert_affinity(l)` float64[N, N]: A[l] = Cp[l]^T diag(a) Cp[l], zero diagonal;
- `device_share(l, expert_device, G)` float64[U, G]: share of each token's expected
  activations that land on each device once the layer's experts are placed.

Scaling choices (ours): dense tables for all layers at once would not fit (Cp float32[L, U, N]
is 7.6 GB for DeepSeek-V3's shape with 128k distinct tokens). Every
statistic is computed from its layer's column of the trace when asked and the caller discards
it. Cp is a scipy CSR matrix: a token's row has at most min(k a_u, N) non-zeros (10.6 per row on
average on a 2M-token DeepSeek-V3-shaped trace, against N = 256), so `request_affinity` and
`expert_affinity` are sparse products. Counting: the occurrences are sorted by token once, a
layer's selections are gathered for `BLOCK_LAYERS` layers at a time, and the (token, expert)
pairs are counted with one bincount per chunk of about `CHUNK_BINS` table cells. The per-layer
CSR counts are cached while they fit in `cache_bytes` (default 1 GiB; 0.63 GB for that trace),
so a solver's second pass (its token table) does not count again; `counts_rows` and
`device_share` also work straight from the occurrences, for solvers that never need the whole
table (`smoe-cem` needs only its top tokens' rows).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from sempar.errors import InputError
from sempar.trace.schema import RoutingTrace

CACHE_BYTES = 1 << 30
CHUNK = 1 << 16          # tokens per block of `device_states`: bounds the [chunk, k, G] counts
TIES = ("lowest", "top1")
BLOCK_LAYERS = 8
CHUNK_BINS = 1 << 18


def layer_counts(tok: np.ndarray, experts: np.ndarray, num_experts: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row int64[m], expert int64[m], count int64[m]) of the non-zero (token, expert) counts.

    tok: int64[T] compact token index; experts: int[T, k] one layer's selections. Sorted by row,
    then decreasing count, then increasing expert id.
    """
    key = (tok[:, None] * num_experts + experts.astype(np.int64)).ravel()
    uniq, count = np.unique(key, return_counts=True)
    row, expert = uniq // num_experts, uniq % num_experts
    order = np.lexsort((expert, -count, row))
    return row[order], expert[order], count[order]


def activation_counts(token_index: np.ndarray, experts: np.ndarray, n_tokens: int,
                      num_experts: int) -> np.ndarray:
    """int32[n_tokens, N]: counts of each (token, expert) selection.

    token_index: int[T] compact token indices in [0, n_tokens); experts: int[T, k] one layer.
    """
    key = token_index.astype(np.int64)[:, None] * num_experts + experts
    return np.bincount(key.ravel(), minlength=n_tokens * num_experts).reshape(
        n_tokens, num_experts).astype(np.int32, copy=False)


def device_counts(experts: np.ndarray, hosts_l: np.ndarray) -> np.ndarray:
    """int32[T, G]: per token, how many of its selected experts each device hosts.

    experts: int[T, k] one layer's selections; hosts_l: bool[G, N] that layer's hosting.
    """
    return hosts_l.T[experts.astype(np.int64)].sum(axis=1, dtype=np.int32)


def device_states(experts: np.ndarray, hosts: np.ndarray, ties: str = "lowest") -> np.ndarray:
    """int16[T, L]: per token and layer, the device hosting most of its experts (module
    docstring; ties: "lowest" device id, or "top1": the tied device hosting the top-1 expert,
    else the lowest id).

    experts: int[T, L, k] (slot 0 the top-1 expert); hosts: bool[L, G, N] (`Placement.hosts()`).
    """
    if ties not in TIES:
        raise InputError(f"ties: {ties!r} is not one of {', '.join(TIES)}")
    T, L, _ = experts.shape
    out = np.empty((T, L), np.int16)
    for l in range(L):
        for s in range(0, T, CHUNK):
            e = experts[s:s + CHUNK, l]
            score = device_counts(e, hosts[l])
            if ties == "top1":
                score = 2 * score + hosts[l][:, e[:, 0].astype(np.int64)].T
            out[s:s + CHUNK, l] = score.argmax(axis=1)
    return out


def layout_hosts(device_of: np.ndarray, num_devices: int, num_layers: int) -> np.ndarray:
    """bool[L, G, N]: the hosting of a layout without replicas, device_of int[N] at every layer
    (e.g. `transitions.contiguous_devices`, what engines do by default)."""
    return np.broadcast_to(device_of[None, None, :] == np.arange(num_devices)[None, :, None],
                           (num_layers, num_devices, device_of.shape[0]))


class AffinityStats:
    """Per-layer statistics of a fit `trace` (see the module docstring).

    Attributes: `tokens` int64[U] sorted fit token ids, `a` float64[U] their frequencies,
    `reqs` int64[R] sorted request ids, `lengths` int64[R] tokens per request, `L`, `N`, `k`.
    """

    def __init__(self, trace: RoutingTrace, cache_bytes: int = CACHE_BYTES):
        meta = trace.meta
        self.trace = trace
        self.L, self.N, self.k = meta.num_layers, meta.num_experts, meta.top_k
        self.tokens, tok = np.unique(np.asarray(trace.token_id, np.int64), return_inverse=True)
        self.reqs, req = np.unique(np.asarray(trace.request_id, np.int64), return_inverse=True)
        cnt = np.bincount(tok, minlength=self.U)
        self.a = cnt.astype(np.float64)
        self.lengths = np.bincount(req, minlength=self.R)
        self._tok, self._req = tok, req
        self._perm = np.argsort(tok, kind="stable")                  # occurrences by token
        self._tok_sorted = tok[self._perm]                           # int64[T], increasing
        self._occ_off = np.concatenate([[0], np.cumsum(cnt)])       # token u: [off[u], off[u+1])
        self._count_bufs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._block: tuple[int, np.ndarray] | None = None
        self._rows_key: bytes | None = None
        self._rows_occ: tuple[np.ndarray, np.ndarray] | None = None
        self._B = None
        self._cache: dict[int, sparse.csr_matrix] = {}
        self._cache_left = cache_bytes

    @property
    def U(self) -> int:
        return int(self.tokens.size)

    @property
    def R(self) -> int:
        return int(self.reqs.size)

    @property
    def token_index(self) -> np.ndarray:
        """int64[T]: each fit occurrence's row in the tables."""
        return self._tok

    @property
    def request_index(self) -> np.ndarray:
        """int64[T]: each fit occurrence's request index (into `reqs`)."""
        return self._req

    def request_tokens(self) -> sparse.csr_matrix:
        """float32 CSR[R, U]: B[r, u] = occurrences of token u in request r."""
        if self._B is None:
            B = sparse.csr_matrix((np.ones(self._tok.size, np.float32), (self._req, self._tok)),
                                  shape=(self.R, self.U))
            B.sum_duplicates()
            self._B = B
        return self._B

    def _sorted_experts(self, l: int) -> np.ndarray:
        """int[T, k]: layer l's selections, occurrences grouped by token. Gathered for
        `BLOCK_LAYERS` layers at once (a row's layers are contiguous in the trace: one gather of
        8 layers cost about what 1.5 single-layer gathers did)."""
        b = l // BLOCK_LAYERS
        if self._block is None or self._block[0] != b:
            self._block = None
            lo = b * BLOCK_LAYERS
            self._block = (b, self.trace.experts[self._perm, lo:lo + BLOCK_LAYERS])
        return self._block[1][:, l - b * BLOCK_LAYERS]

    def _token_chunks(self, width: int):
        """(u0, u1, o0, o1): token rows [u0, u1) and their occurrences [o0, o1) in the sorted
        order, about `CHUNK_BINS` / width tokens at a time (ours: a bincount over a few
        hundred thousand bins stays in cache; one over all U x N bins took 1.5-2x longer)."""
        step = max(1, CHUNK_BINS // width)
        for u0 in range(0, self.U, step):
            u1 = min(self.U, u0 + step)
            yield u0, u1, int(self._occ_off[u0]), int(self._occ_off[u1])

    def _counting_buffers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key int64[T]: each sorted occurrence's first table cell in its `_token_chunks(N)`
        chunk, (token - u0) N; a reusable int64 buffer for a chunk's (token, expert) cells; a
        reusable bool buffer for its non-zero marks). Made once: a fresh key and mark array a
        chunk cost about a third of the counting in page faults on the 2-core dev machine."""
        if self._count_bufs is None:
            N = self.N
            key = np.empty(self._tok_sorted.size, np.int64)
            most = 0
            for u0, _, o0, o1 in self._token_chunks(N):
                np.multiply(self._tok_sorted[o0:o1] - u0, N, out=key[o0:o1])
                most = max(most, o1 - o0)
            self._count_bufs = (key, np.empty(most * self.k, np.int64),
                                np.empty(max(1, CHUNK_BINS // N) * N, bool))
        return self._count_bufs

    def counts(self, l: int) -> sparse.csr_matrix:
        """float32 CSR[U, N]: co-activation counts c[u, e] at layer l (exact integers), sorted
        indices."""
        C = self._cache.get(l)
        if C is not None:
            return C
        U, N, k = self.U, self.N, self.k
        ex = self._sorted_experts(l)
        key0, keybuf, mark = self._counting_buffers()
        nzs, cs = [], []
        for u0, u1, o0, o1 in self._token_chunks(N):
            key = keybuf[:(o1 - o0) * k]
            np.add(key0[o0:o1, None], ex[o0:o1], out=key.reshape(o1 - o0, k))
            c = np.bincount(key, minlength=(u1 - u0) * N)
            m = np.not_equal(c, 0, out=mark[:c.size])    # flatnonzero of bools: 2.5x faster
            nz = np.flatnonzero(m)
            cs.append(c[nz])
            nz += u0 * N
            nzs.append(nz)
        nz = np.concatenate(nzs)
        data = np.concatenate(cs).astype(np.float32)
        indptr = np.searchsorted(nz, np.arange(U + 1, dtype=np.int64) * N)
        C = sparse.csr_matrix((data, (nz % N).astype(np.int32), indptr), shape=(U, N))
        C.has_sorted_indices = True
        size = C.data.nbytes + C.indices.nbytes + C.indptr.nbytes
        if size <= self._cache_left:
            self._cache[l] = C
            self._cache_left -= size
        return C

    def forget(self, l: int) -> None:
        """Drop layer l's cached counts (a caller done with the layer frees the room)."""
        C = self._cache.pop(l, None)
        if C is not None:
            self._cache_left += C.data.nbytes + C.indices.nbytes + C.indptr.nbytes

    def cp(self, l: int) -> sparse.csr_matrix:
        """float32 CSR[U, N]: Cp[l] = c / (k a), rows sum to 1."""
        C = self.counts(l)
        data = C.data / np.repeat(self.k * self.a, np.diff(C.indptr))        # float64, then cast
        return sparse.csr_matrix((data.astype(np.float32), C.indices, C.indptr), shape=C.shape)

    def _row_occurrences(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions int64[m] in the token-sorted occurrences, rank int64[m] of their row in
        `rows`) for the occurrences of the tokens `rows` (int[n], increasing)."""
        key = rows.tobytes()
        if self._rows_key != key:
            cnt = self.a.astype(np.int64)
            off = np.concatenate([[0], np.cumsum(cnt)])
            n_occ = cnt[rows]
            rank = np.repeat(np.arange(rows.size), n_occ)
            pos = np.arange(rank.size) - np.repeat(np.cumsum(n_occ) - n_occ, n_occ)
            self._rows_key, self._rows_occ = key, (off[rows][rank] + pos, rank)
        return self._rows_occ

    def counts_rows(self, l: int, rows: np.ndarray) -> np.ndarray:
        """float32[len(rows), N]: dense counts of the token rows `rows` (increasing) at layer l,
        from those tokens' occurrences only (or the cached table)."""
        rows = np.asarray(rows, np.int64)
        if l in self._cache:
            return self._cache[l][rows].toarray()
        pos, rank = self._row_occurrences(rows)
        key = (rank * self.N)[:, None] + self._sorted_experts(l)[pos]
        c = np.bincount(key.ravel(), minlength=rows.size * self.N)
        return c.reshape(rows.size, self.N).astype(np.float32)

    def cp_rows(self, l: int, rows: np.ndarray) -> np.ndarray:
        """float32[len(rows), N]: dense Cp[l] rows (c / (k a), divided in float64)."""
        rows = np.asarray(rows, np.int64)
        c = self.counts_rows(l, rows)
        return (c / (self.k * self.a[rows])[:, None]).astype(np.float32)

    def expert_load(self, l: int) -> np.ndarray:
        """float64[N]: expected activations per expert, a @ Cp[l] (= c.sum(0) / k)."""
        return np.asarray(self.counts(l).sum(axis=0, dtype=np.float64)).ravel() / self.k

    def request_affinity(self, l: int) -> np.ndarray:
        """float32[R, N]: Q[l] = B @ Cp[l] (request-expert affinity)."""
        return (self.request_tokens() @ self.cp(l)).toarray().astype(np.float32, copy=False)

    def expert_affinity(self, l: int) -> np.ndarray:
        """float64[N, N]: A[l] = Cp^T diag(a) Cp with a zero diagonal (expert-expert affinity)."""
        cp = self.cp(l)                                 # a_u Cp[u] = c_u / k: one product
        A = (cp.T.tocsr() @ self.counts(l)).toarray().astype(np.float64) / self.k
        np.fill_diagonal(A, 0.0)
        return A

    def device_share(self, l: int, expert_device: np.ndarray, G: int) -> np.ndarray:
        """float64[U, G]: share of each token's expected activations at layer l on each device.

        Computed from the integer counts, so equal shares tie exactly (argmax: lowest device).
        """
        dev_of = np.asarray(expert_device, np.int64)
        C = self._cache.get(l)
        if C is not None:              # from the cached table: C @ one-hot, exact integer sums
            onehot = np.zeros((self.N, G))
            onehot[np.arange(self.N), dev_of] = 1.0
            share = np.asarray(C @ onehot)
        else:                                      # from the occurrences: T k entries
            dev = dev_of[self._sorted_experts(l)]
            share = np.empty((self.U, G))
            for u0, u1, o0, o1 in self._token_chunks(G):
                key = ((self._tok_sorted[o0:o1] - u0) * G)[:, None] + dev[o0:o1]
                share[u0:u1] = np.bincount(key.ravel(), minlength=(u1 - u0) * G).reshape(-1, G)
        share /= (self.k * self.a)[:, None]
        return share
