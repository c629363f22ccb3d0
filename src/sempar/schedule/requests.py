"""Attention-DP request scheduling (Sem-MoE §3.2 "Data scheduling: Attention-DP", App. B Alg. 2).

In Attention-DP every request runs its attention on one DP rank, which is also its tokens' home
device for every MoE layer (docs/design.md, "Home device"). A request scheduler picks that rank when
the request arrives. Policies, registered by name in `REQUEST_POLICIES`:

- `round-robin`: the r-th request in arrival order goes to rank r mod G (the baseline).
- `alg2`: Sem-MoE Alg. 2 as written. The request's score of rank g sums, over its tokens and
  layers, the confidence Tp[l, u] of the token table T wherever T[l, u] == g (Alg. 2 line 3,
  `sum(T[R, :])`, read as the confidence-weighted vote of the token rows of T). The best unmasked
  rank takes it and is masked; once every rank has taken one request in the round the mask is
  reset (lines 4-8). Requests therefore go out in rounds of exactly G, one per rank.
- `balanced` (ours, not in the paper): the same scores, no round mask. The request goes to its
  best-scoring *admissible* rank; if none is admissible, to the least-loaded rank (ties: best
  score). Rank g with q[g] queued tokens is admissible for a request of n tokens when taking it
  does not raise the largest queue above max(current largest queue, (1 + slack) x the mean queue
  after taking it), and the same holds for the tokens assigned since the start of the stream. So a
  same-domain burst stays on its rank while that rank has room, and both the queues (tokens of
  requests submitted and not yet completed) and the stream's per-rank totals stay within `slack`
  of their mean, up to one request's granularity.

Two forms, which agree (tests/schedule/test_request_policies.py):

- batch, `assign(token_ids, offsets) -> int32[R]`: requests in arrival order, request r's tokens
  are token_ids[offsets[r]:offsets[r+1]]; a pure function of its inputs (a fresh stream). Request
  completion is modelled FIFO: a request leaves its rank's queue when `window` (W) more requests
  have arrived, so the queues are the tokens of the last W requests (only `balanced` reads them).
- streaming, `submit(token_ids) -> rank` and `complete(rank, num_tokens)`: continuous arrivals
  with the real completions; `submit` after `complete` of request i - W reproduces `assign`.

Scores are table lookups only: the per-token score matrix S float32[U + 1, G] is built once per
table; row U is zeros, so tokens the table does not know contribute nothing (a request with no
known token goes to the first unmasked rank under `alg2`, to the least-loaded rank under
`balanced`). Request scores are one sparse (requests x tokens) @ S product.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from sempar.errors import InputError
from sempar.predict.token_table import TokenTable
from sempar.registry import Registry
from sempar.schedule.balance import BALANCE_FROM, BALANCE_SLACK  # noqa: F401 (re-exported)

REQUEST_POLICIES: Registry[type["RequestPolicy"]] = Registry("request policy")
DENSE_MAX = 1 << 24      # largest token id served by the dense id -> row map (64 MiB of int32)


@dataclass(frozen=True)
class Prepared:
    """One request as `RequestPolicy.prepare` summarises it: tokens int64[n], the distinct rows
    of S its tokens read (int[m]) and how many tokens read each (int64[m]), plus what a policy
    adds (`extra`, e.g. prefix-block hashes)."""

    tokens: np.ndarray
    rows: np.ndarray
    counts: np.ndarray
    extra: object = None


def score_matrix(table: TokenTable | None, num_ranks: int) -> np.ndarray:
    """float32[U + 1, G]: S[u, g] = sum over layers l of Tp[l, u] where T[l, u] == g; row U = 0."""
    if table is None:
        return np.zeros((1, num_ranks), np.float32)
    L, U = table.device.shape
    dev = table.device.astype(np.int64)
    ok = (dev >= 0) & (dev < num_ranks)          # a table from a larger EP degree: ignore the rest
    key = (np.arange(U)[None, :] * num_ranks + dev)[ok]
    S = np.bincount(key, weights=table.confidence[ok], minlength=(U + 1) * num_ranks)
    return S.reshape(U + 1, num_ranks).astype(np.float32)


class RequestPolicy:
    """A request -> DP rank scheduler over `num_ranks` ranks, guided by a token table (or None).

    Capabilities, declared by each registered class (read by the router, the CLI's help and the
    contract tests): `needs_scores` it scores ranks from the token table (the router then needs
    a placement with one); `balances` what it keeps within `BALANCE_SLACK` of the per-rank mean
    over any stream of at least `BALANCE_FROM` x G requests, whatever the arrival pattern
    ("requests", "tokens"; tests/schedule/test_policy_balance.py); `summary` one line for `--help`."""

    needs_scores = True
    balances: tuple[str, ...] = ()
    summary = ""

    def __init__(self, num_ranks: int, table: TokenTable | None = None, window: int | None = None):
        if num_ranks < 1:
            raise InputError(f"num_ranks: {num_ranks} (need >= 1)")
        self.num_ranks = G = int(num_ranks)
        self.table = table
        self.window = int(window) if window is not None else 8 * G   # requests in flight, batch form
        if self.window < 1:
            raise InputError(f"window: {window} (need >= 1)")
        self.S = score_matrix(table, G)
        U = self.S.shape[0] - 1
        top = int(table.token_id[-1]) + 1 if U else 0
        # Dense token id -> row of S (U for unknown): one gather per token, no binary search;
        # token ids beyond a vocabulary's range fall back to the table's binary search.
        self._row = np.full(top + 1, U, np.int32) if top <= DENSE_MAX else None
        if U and self._row is not None:
            self._row[table.token_id] = np.arange(U, dtype=np.int32)
        self.reset()

    def reset(self) -> None:
        """Forget the streaming state: empty queues, a fresh round."""
        self.queued = [0] * self.num_ranks          # tokens submitted and not completed, per rank
        self._allowed: Sequence[bool] | None = None
        self.last_row: list[float] = []
        self._state_reset()

    def _state_reset(self) -> None:
        pass

    # -- scores -----------------------------------------------------------------------------
    @staticmethod
    def _check(token_ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tok = np.ascontiguousarray(token_ids, np.int64).ravel()
        off = np.asarray(offsets, np.int64).ravel()
        if off.size < 1 or off[0] != 0 or off[-1] != tok.size or np.any(np.diff(off) < 0):
            raise InputError(f"offsets: need 0 = offsets[0] <= ... <= offsets[-1] = {tok.size} "
                             "(the number of tokens)")
        return tok, off

    def rows_of(self, tok: np.ndarray) -> np.ndarray:
        """int[n]: each token's row of S (U, the zero row, for ids the table does not know);
        tok int64[n], contiguous."""
        if self._row is not None:
            # Negative ids become huge as uint64 and clip to the unknown slot with the large ones.
            return self._row[np.minimum(tok.view(np.uint64), self._row.size - 1)]
        pos, seen = self.table.index(tok)
        return np.where(seen, pos, self.S.shape[0] - 1)

    def scores(self, token_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """float32[R, G]: each request's score per rank (sum of its tokens' rows of S)."""
        tok, off = self._check(token_ids, offsets)
        R = off.size - 1
        idx = self.rows_of(tok)
        if R == 1:                                 # one request (the router's submit): a gather
            return self.S[idx].sum(axis=0, dtype=np.float32).reshape(1, self.num_ranks)
        itype = np.int32 if tok.size < 2**31 else np.int64
        A = sp.csr_matrix((np.ones(tok.size, np.float32), idx.astype(itype, copy=False),
                           off.astype(itype)), shape=(R, self.S.shape[0]))
        return np.asarray(A @ self.S, np.float32).reshape(R, self.num_ranks)

    # -- the two forms ------------------------------------------------------------------------
    def assign(self, token_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """int32[R]: the rank of each request (arrival order), as one fresh stream."""
        tok, off = self._check(token_ids, offsets)
        lens = np.diff(off)
        sc = self.scores(tok, off) if self.needs_scores else np.empty((lens.size, 0), np.float32)
        return np.asarray(self._assign(sc, lens), np.int32)

    def prepare(self, token_ids: np.ndarray) -> "Prepared":
        """The stateless part of `submit` for one request (its table rows and their counts), so
        a caller can run it off its event loop for a big prompt; thread-safe (reads S only)."""
        tok = np.ascontiguousarray(token_ids, np.int64).ravel()
        rows, counts = np.unique(self.rows_of(tok), return_counts=True)
        return Prepared(tok, rows, counts)

    def _score_row(self, tok: np.ndarray, prep: "Prepared | None") -> list[float]:
        if not self.needs_scores:
            return []
        if prep is not None:                       # counts @ rows: the same sum, regrouped
            return (prep.counts.astype(np.float32) @ self.S[prep.rows]).tolist()
        # scores() of one request, without its offsets checks (the router's hot path)
        return self.S[self.rows_of(tok)].sum(axis=0, dtype=np.float32).tolist()

    def submit(self, token_ids: "np.ndarray | Prepared", allowed: Sequence[bool] | None = None
               ) -> int:
        """The rank of one newly arrived request (token_ids int[n], or its `prepare`d form);
        its tokens join that queue.

        `allowed` bool[G] (the router's per-rank in-flight bound): ranks marked False are not
        chosen; at least one must be True. The last request's score row stays in `last_row`
        (float[G]).
        """
        prep = token_ids if isinstance(token_ids, Prepared) else None
        tok = prep.tokens if prep is not None else np.ascontiguousarray(token_ids, np.int64).ravel()
        row = self._score_row(tok, prep)
        self.last_row = row
        self._allowed = allowed if allowed is not None and not all(allowed) else None
        try:
            g = self._choose(row, tok.size)
        finally:
            self._allowed = None
        self.queued[g] += tok.size
        return g

    def complete(self, rank: int, num_tokens: int) -> None:
        """A request of `num_tokens` on `rank` finished: its tokens leave the rank's queue."""
        if not 0 <= rank < self.num_ranks:
            raise InputError(f"complete: rank {rank} is not in 0..{self.num_ranks - 1}")
        if not 0 <= num_tokens <= self.queued[rank]:
            raise InputError(f"complete: rank {rank} holds {self.queued[rank]} queued tokens, "
                             f"cannot complete {num_tokens}")
        self.queued[rank] -= int(num_tokens)

    def _choose(self, row: list[float], n: int) -> int:
        raise NotImplementedError

    def _assign(self, scores: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """int32[R] from scores float32[R, G] and lengths int64[R], without touching the
        streaming state (the batch form of `_choose`)."""
        raise NotImplementedError


@REQUEST_POLICIES.register("round-robin")
class RoundRobin(RequestPolicy):
    """Arrival order, request r to rank r mod G; the table is not read (the baseline)."""

    needs_scores = False
    balances = ("requests",)
    summary = "request r to rank r mod G (SGLang's default)"

    def _state_reset(self) -> None:
        self._next = 0

    def _choose(self, row: list[float], n: int) -> int:
        G, ok = self.num_ranks, self._allowed
        g = self._next
        if ok is not None:                          # the next rank in turn that may take one
            g = next((h % G for h in range(g, g + G) if ok[h % G]), g)
        self._next = (g + 1) % G
        return g

    def _assign(self, scores: np.ndarray, lens: np.ndarray) -> np.ndarray:
        return (np.arange(scores.shape[0]) % self.num_ranks).astype(np.int32)


@REQUEST_POLICIES.register("alg2")
class Alg2(RequestPolicy):
    """Sem-MoE App. B Alg. 2: best unmasked rank by score, one request per rank per round."""

    balances = ("requests",)
    summary = "Sem-MoE Alg. 2 as written (rounds of G)"

    def _state_reset(self) -> None:
        self._mask = [True] * self.num_ranks      # True = the rank may still take one this round

    def _choose(self, row: list[float], n: int) -> int:
        best, bs, ok = -1, -np.inf, self._allowed
        for g, (m, s) in enumerate(zip(self._mask, row)):
            if m and s > bs and (ok is None or ok[g]):   # first maximum wins, as np.argmax
                best, bs = g, s
        if best < 0:                               # every unmasked rank is at its bound
            best = ok.index(True)
        self._mask[best] = False
        if not any(self._mask):
            self._mask = [True] * self.num_ranks
        return best

    def _assign(self, scores: np.ndarray, lens: np.ndarray) -> np.ndarray:
        # Rounds are independent (the mask resets every G requests), so the G steps of a round
        # run vectorised over all rounds at once.
        R, G = scores.shape
        n_rounds = -(-R // G)
        sc = np.full((n_rounds * G, G), -np.inf, np.float32)   # padding rows never win a rank
        sc[:R] = scores
        sc = sc.reshape(n_rounds, G, G)
        free = np.ones((n_rounds, G), bool)
        out = np.empty((n_rounds, G), np.int32)
        rows = np.arange(n_rounds)
        for j in range(G):
            g = np.where(free, sc[:, j, :], -np.inf).argmax(axis=1)
            out[:, j] = g
            free[rows, g] = False
        return out.reshape(-1)[:R]


@REQUEST_POLICIES.register("balanced")
class Balanced(RequestPolicy):
    """Ours: best-scoring rank within the load bounds, else the least-loaded (module docstring).

    Rank g may take a request of n tokens when q[g] + n <= max(max(q), (1 + slack) x
    (sum(q) + n) / G) for the queues q (tokens in flight) and, with `stream_bound`, the same for
    the tokens assigned since the start (so the stream's per-rank totals stay within `slack` too:
    queue admission alone lets a rank drift when the others' requests complete first).
    `window` W (default 8 G) is the number of requests in flight in the batch form.
    """

    balances: tuple[str, ...] = ()   # its stream bound admits the current largest: no contract
    summary = "Alg. 2's scores within in-flight and stream token bounds"

    def __init__(self, num_ranks: int, table: TokenTable | None = None, window: int | None = None,
                 slack: float = 0.05, stream_bound: bool = True):
        super().__init__(num_ranks, table, window)
        if slack < 0:
            raise InputError(f"slack: {slack} (need >= 0)")
        self.slack = float(slack)
        self.stream_bound = bool(stream_bound)

    def _state_reset(self) -> None:
        self.assigned = [0] * self.num_ranks       # tokens ever submitted, per rank

    def _choose(self, row: list[float], n: int) -> int:
        q, c, ok = self.queued, self.assigned, self._allowed
        g = self._pick(row, q, c, n, sum(q), sum(c))
        if ok is not None and not ok[g]:           # at the router's bound: least loaded allowed
            g = min((h for h in range(self.num_ranks) if ok[h]), key=lambda h: (q[h], c[h]))
        c[g] += n
        return g

    def _pick(self, row: Sequence[float], q: list[int], c: list[int], n: int, total: int,
              ctotal: int) -> int:
        """Best score among the admissible ranks; ties (every rank, for a request with no known
        token) to the fewest tokens so far. The least-loaded queue always passes the queue
        bound (with nothing in flight one request exceeds any mean-based cap), so sequential
        traffic is bounded by the stream totals; none admissible: the fewest tokens so far."""
        s1, G = 1.0 + self.slack, self.num_ranks
        pref = sorted(range(G), key=lambda g: (-row[g], c[g])) if len(row) else \
            sorted(range(G), key=c.__getitem__)
        cap = max(max(q), s1 * (total + n) / G) - n
        ccap = max(max(c), s1 * (ctotal + n) / G) - n if self.stream_bound else float("inf")
        low = min(q)
        for g in pref:
            if (q[g] <= cap or q[g] == low) and c[g] <= ccap:
                return g
        return min(pref, key=lambda g: (c[g], q[g]) if self.stream_bound else (q[g], c[g]))

    def _assign(self, scores: np.ndarray, lens: np.ndarray) -> np.ndarray:
        # The streaming decision (`_choose`) with FIFO completion after W requests in flight.
        R, G = scores.shape
        rows = scores.tolist()
        lens_l = lens.tolist()
        q, c, W = [0] * G, [0] * G, self.window
        total = ctotal = 0
        out = [0] * R
        for i in range(R):
            if i >= W:
                j = i - W
                q[out[j]] -= lens_l[j]
                total -= lens_l[j]
            n = lens_l[i]
            g = self._pick(rows[i], q, c, n, total, ctotal)
            q[g] += n
            c[g] += n
            total += n
            ctotal += n
            out[i] = g
        return np.asarray(out, np.int32)


def make_policy(name: str, num_ranks: int, table: TokenTable | None = None, **kw) -> RequestPolicy:
    """The registered policy `name`, constructed."""
    return REQUEST_POLICIES.get(name)(num_ranks, table, **kw)


# -- evaluation on a trace -------------------------------------------------------------------------

def request_arrays(request_id: np.ndarray, token_id: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token_ids int64[T], offsets int64[R + 1], rows int64[T]): the tokens grouped by request in
    arrival order (first appearance), `rows` the trace rows in that order."""
    _, first, inv = np.unique(request_id, return_index=True, return_inverse=True)
    arrival = np.empty(first.size, np.int64)
    arrival[np.argsort(first, kind="stable")] = np.arange(first.size)
    key = arrival[inv.reshape(-1)]
    rows = np.argsort(key, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(key, minlength=first.size))])
    return np.asarray(token_id, np.int64)[rows], offsets.astype(np.int64), rows
