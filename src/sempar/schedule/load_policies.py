"""Request policies for a live router (issue 29): each rank's in-flight load is an input.

Registered in `schedule.requests.REQUEST_POLICIES` beside Alg. 2 and `balanced`, so
`sempar evaluate --mode dp --online --policy NAME`, `serve-sim` and `sempar router` run the same
class: the router calls the streaming form (`submit` / `complete` with the real completions), the
evaluator the batch form (`assign`, completions FIFO after `window` requests), and the two agree
(tests/schedule/test_load_policies.py).

- `least-inflight`: the rank holding the fewest in-flight tokens among those the balance
  contract admits (`balance.contract_ranks`; ties: the fewest tokens so far). What SGLang's and
  vLLM's own balancers approximate, bounded; the table is not read.
- `expert` (ours): Alg. 2's affinity (the request's row of the score matrix S,
  `requests.score_matrix`), one request at a time, no round mask. The request goes to its
  best-scoring *admissible* rank, the filters applied in turn (issue 37's balance contract,
  schedule/balance.py): (1) requests, hard: the per-rank counts stay in the band of
  max(1, slack x mean) around the mean and schedulable in it (`request_admissible`); (2) tokens:
  the ranks whose choice leaves every rank's tokens within slack x mean + rho x the longest
  request, and its projected tokens (request count brought to the mean) within token_slack x
  mean (`token_excess`), else the one leaving the least outside; (3) in flight: within
  `inflight_slack` of the mean tokens in flight, the least-loaded rank always passing (a rank
  whose requests run long takes no more until they finish), else the first of (2). Ties (a
  request with no known token ties everywhere) go to the fewest tokens so far.
- `expert+prefix` (ours): `expert` with a prefix-cache affinity term. Each rank keeps a bounded
  LRU of the block-prefix hashes it was sent (`PrefixCache`, blocks of `block` tokens, a stand-in
  for the engine's radix cache); a rank's preference is its score divided by the best rank's
  score plus `prefix_weight` x the share of the request's tokens already cached there, under the
  same admission bounds.

- `expert-idf` (ours): `expert`'s rule and bounds on a reweighted affinity. (1) Each token's row
  of S counts log((m + 2) / (1 + df)), m the requests this policy saw before, df those among them
  that held the token (an online inverse document frequency: a chat template's or a question
  frame's tokens, in every request, stop voting); (2) the request's row, per token, is divided
  rank by rank by the mean of the earlier requests' per-token rows (the table's standing bias
  towards some ranks is taken out, so the balance bounds fire less often). Both statistics come
  from requests already routed, so the policy is causal; the batch form replays the streaming one.

Measured on GPT-OSS-20B's held-out requests at EP 4 (benchmarks/bench_router.py, docs/router.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from sempar.errors import InputError
from sempar.predict.token_table import TokenTable
from sempar.schedule.balance import BALANCE_SLACK, contract_ranks
from sempar.schedule.requests import REQUEST_POLICIES, Prepared, RequestPolicy


def _least(q: Sequence[int], ok: Sequence[bool] | None, pref: Sequence[int] | None = None) -> int:
    """The rank with the smallest q among the allowed ones (ties: first in `pref`, else lowest)."""
    order = pref if pref is not None else range(len(q))
    cand = [g for g in order if ok is None or ok[g]] or list(order)
    low = min(q[g] for g in cand)
    return next(g for g in cand if q[g] == low)


def _fifo_assign(policy: RequestPolicy, scores: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The batch form by replaying the streaming one: request i - W completes before request i
    (W = policy.window) on a fresh state, restored afterwards."""
    saved = policy.__dict__.copy()
    policy.reset()
    W, out, lens_l = policy.window, [], lens.tolist()
    try:
        for i, n in enumerate(lens_l):
            if i >= W:
                policy.complete(out[i - W], lens_l[i - W])
            row = scores[i].tolist() if policy.needs_scores else []
            g = policy._choose(row, n)
            policy.queued[g] += n
            out.append(g)
    finally:
        policy.__dict__.update(saved)
    return np.asarray(out, np.int32)


@REQUEST_POLICIES.register("least-inflight")
class LeastInflight(RequestPolicy):
    """The rank with the fewest in-flight tokens among those the balance contract admits
    (`balance.contract_ranks`, issue 45: with nothing in flight every rank ties, and the
    tie-break alone let request counts drift to 38 / 28 / 23 / 31 under one-at-a-time traffic);
    ties to the fewest tokens so far, then the fewest requests; the table is not read.
    slack, token_slack, rho: the contract's bounds, as `expert`'s (without the projected
    tokens' band, token_slack = inf, tokens reach 6 % above the contract's bound at G = 3 in
    tests/schedule/test_policy_balance.py)."""

    needs_scores = False
    balances = ("requests", "tokens")
    summary = "the fewest in-flight tokens within the balance contract (vLLM's balancer, bounded)"

    def __init__(self, num_ranks: int, table: TokenTable | None = None, window: int | None = None,
                 slack: float = BALANCE_SLACK, token_slack: float = 0.08, rho: float = 0.5):
        if min(slack, token_slack, rho) < 0:
            raise InputError(f"slack {slack}, token_slack {token_slack}, rho {rho}: need >= 0")
        self.slack, self.token_slack, self.rho = float(slack), float(token_slack), float(rho)
        super().__init__(num_ranks, table, window)

    def _state_reset(self) -> None:
        self.assigned = [0] * self.num_ranks       # tokens ever submitted, per rank
        self.taken = [0] * self.num_ranks          # requests ever submitted, per rank
        self.n_max = 0                             # the longest request so far

    def _choose(self, row: list[float], n: int) -> int:
        q, c, k, ok = self.queued, self.assigned, self.taken, self._allowed
        pref = sorted(range(self.num_ranks), key=lambda h: (q[h], c[h], k[h]))
        cand = [g for g in pref if ok is None or ok[g]] or pref
        self.n_max = max(self.n_max, n)
        g = contract_ranks(cand, k, c, n, self.n_max, self.slack, self.rho, self.token_slack)[0]
        c[g] += n
        k[g] += 1
        return g

    def _assign(self, scores: np.ndarray, lens: np.ndarray) -> np.ndarray:
        return _fifo_assign(self, scores, lens)


@REQUEST_POLICIES.register("expert")
class Expert(RequestPolicy):
    """Best-scoring rank within the stream and in-flight bounds (module docstring).

    slack: the contract's bound (requests within max(1, slack x mean) of the mean, tokens
    within slack x mean + rho x the longest request); token_slack: the projected tokens' bound
    (0.08: on GPT-OSS-20B's three splits 0.05 gave `expert-idf` 0.887 of the ceiling, 0.065
    0.906, 0.08 0.908, 0.10 0.892; the real tokens stay within the contract either way);
    inflight_slack: the in-flight tokens' bound; window W: requests in flight
    in the batch form (default 8 G)."""

    balances = ("requests", "tokens")
    summary = "Alg. 2's affinity within stream and in-flight bounds"

    def __init__(self, num_ranks: int, table: TokenTable | None = None, window: int | None = None,
                 slack: float = BALANCE_SLACK, inflight_slack: float = 0.5,
                 token_slack: float = 0.08, rho: float = 0.5):
        if min(slack, inflight_slack, token_slack, rho) < 0:
            raise InputError(f"slack {slack}, inflight_slack {inflight_slack}, token_slack "
                             f"{token_slack}, rho {rho}: need >= 0")
        self.slack, self.inflight_slack = float(slack), float(inflight_slack)
        self.token_slack, self.rho = float(token_slack), float(rho)
        super().__init__(num_ranks, table, window)

    def _state_reset(self) -> None:
        self.assigned = [0] * self.num_ranks       # tokens ever submitted, per rank
        self.taken = [0] * self.num_ranks          # requests ever submitted, per rank
        self.n_max = 0                             # the longest request so far

    def _preference(self, row: list[float], n: int) -> list[int]:
        """Ranks best first; ties (every rank, when no token is known) to the rank with the
        fewest tokens so far, then the fewest requests (never simply the lowest id)."""
        c, k = self.assigned, self.taken
        return sorted(range(self.num_ranks), key=lambda g: (-row[g], c[g], k[g]))

    def _choose(self, row: list[float], n: int) -> int:
        q, c, k, ok = self.queued, self.assigned, self.taken, self._allowed
        G, s = self.num_ranks, self.slack
        pref = self._preference(row if row else [0.0] * G, n)
        cand = [g for g in pref if ok is None or ok[g]] or pref
        # (1) requests, hard, and (2) tokens: the contract's ranks (balance.contract_ranks),
        # in `pref`'s order (ties: best score).
        self.n_max = max(self.n_max, n)
        adm = contract_ranks(cand, k, c, n, self.n_max, s, self.rho, self.token_slack)
        # (3) in flight: within inflight_slack of the mean; the least-loaded rank always passes
        # (with nothing in flight one request alone exceeds any mean-based cap).
        qmin = min(q[g] for g in adm)
        qcap = max(max(q), (1.0 + self.inflight_slack) * (sum(q) + n) / G) - n
        g = next((g for g in adm if q[g] <= qcap or q[g] == qmin), adm[0])
        c[g] += n
        k[g] += 1
        return g

    def _assign(self, scores: np.ndarray, lens: np.ndarray) -> np.ndarray:
        return _fifo_assign(self, scores, lens)


class PrefixCache:
    """A bounded LRU of block-prefix hashes per rank (a stand-in for each engine rank's radix
    cache): `hashes(tokens)` the chained hash of each full block of `block` tokens,
    `match(g, hashes)` how many leading blocks rank g holds, `insert(g, hashes)`."""

    def __init__(self, num_ranks: int, block: int = 32, capacity: int = 8192):
        if block < 1 or capacity < 1:
            raise InputError(f"prefix cache: block {block}, capacity {capacity} (need >= 1)")
        self.block, self.capacity = int(block), int(capacity)
        self.ranks: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_ranks)]

    def hashes(self, tokens: np.ndarray) -> list[int]:
        tok = np.ascontiguousarray(tokens, np.int64).ravel()
        B, h, out = self.block, 0, []
        for i in range(tok.size // B):
            h = hash((h, tok[i * B:(i + 1) * B].tobytes()))
            out.append(h)
        return out

    def match(self, g: int, hashes: list[int]) -> int:
        cache, m = self.ranks[g], 0
        for h in hashes:
            if h not in cache:
                break
            m += 1
        return m

    def insert(self, g: int, hashes: list[int]) -> None:
        cache = self.ranks[g]
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.capacity:
            cache.popitem(last=False)


@REQUEST_POLICIES.register("expert+prefix")
class ExpertPrefix(Expert):
    """`expert` plus a prefix-cache affinity term (module docstring); the batch form replays the
    streaming one, since the caches need the tokens."""

    summary = "expert plus a prefix-cache affinity term"

    def __init__(self, num_ranks: int, table: TokenTable | None = None, window: int | None = None,
                 slack: float = 0.05, inflight_slack: float = 0.5, prefix_weight: float = 1.0,
                 block: int = 32, capacity: int = 8192, token_slack: float = 0.08,
                 rho: float = 0.5):
        self.prefix_weight, self.block, self.capacity = float(prefix_weight), block, capacity
        super().__init__(num_ranks, table, window, slack, inflight_slack, token_slack, rho)

    def _state_reset(self) -> None:
        super()._state_reset()
        self.cache = PrefixCache(self.num_ranks, self.block, self.capacity)
        self._hashes: list[int] = []

    def prepare(self, token_ids: np.ndarray) -> Prepared:
        p = super().prepare(token_ids)
        return Prepared(p.tokens, p.rows, p.counts, self.cache.hashes(p.tokens))

    def submit(self, token_ids, allowed: Sequence[bool] | None = None) -> int:
        self._hashes = (token_ids.extra if isinstance(token_ids, Prepared)
                        else self.cache.hashes(token_ids))
        g = super().submit(token_ids, allowed)
        self.cache.insert(g, self._hashes)
        return g

    def _preference(self, row: list[float], n: int) -> list[int]:
        top = max(row) if max(row) > 0.0 else 1.0       # no known token: the prefix term alone
        hit = [self.cache.match(g, self._hashes) * self.block / max(n, 1)
               for g in range(self.num_ranks)]
        v = [row[g] / top + self.prefix_weight * hit[g] for g in range(self.num_ranks)]
        return super()._preference(v, n)

    def assign(self, token_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        return _replay_assign(self, token_ids, offsets)


def _replay_assign(policy: RequestPolicy, token_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The batch form of a policy whose state needs the tokens: `submit` each request on a fresh
    state, request i - W completing before request i (W = policy.window); state restored."""
    tok, off = policy._check(token_ids, offsets)
    saved = policy.__dict__.copy()
    policy.reset()
    out: list[int] = []
    try:
        for i in range(off.size - 1):
            if i >= policy.window:
                j = i - policy.window
                policy.complete(out[j], int(off[j + 1] - off[j]))
            out.append(policy.submit(tok[off[i]:off[i + 1]]))
    finally:
        policy.__dict__.update(saved)
    return np.asarray(out, np.int32)


@REQUEST_POLICIES.register("expert-idf")
class ExpertIdf(Expert):
    """`expert` on idf-weighted, rank-debiased scores (module docstring); same bounds and knobs."""

    summary = "expert on idf-weighted, rank-debiased scores (the router's default)"

    def _state_reset(self) -> None:
        super()._state_reset()
        self.df = np.zeros(self.S.shape[0], np.int64)   # requests that held each table row
        self.seen = 0                                   # requests submitted
        self.per_sum = np.zeros(self.num_ranks)         # sum of their per-token weighted rows

    def submit(self, token_ids, allowed: Sequence[bool] | None = None) -> int:
        p = token_ids if isinstance(token_ids, Prepared) else self.prepare(token_ids)
        tok, rows, count = p.tokens, p.rows, p.counts
        w = count * np.log((self.seen + 2.0) / (1.0 + self.df[rows]))
        raw = w @ self.S[rows].astype(np.float64)       # float64[G]; row U of S is zero
        per = raw / max(tok.size, 1)
        if self.seen and self.per_sum.max() > 0.0:
            mean = self.per_sum / self.seen
            per_n = per / np.maximum(mean, 1e-12 * mean.max())
        else:
            per_n = per
        self.df[rows] += 1
        self.seen += 1
        self.per_sum += per
        self.last_row = raw.tolist()
        self._allowed = allowed if allowed is not None and not all(allowed) else None
        try:
            g = self._choose(per_n.tolist(), tok.size)
        finally:
            self._allowed = None
        self.queued[g] += tok.size
        return g

    def assign(self, token_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        return _replay_assign(self, token_ids, offsets)
