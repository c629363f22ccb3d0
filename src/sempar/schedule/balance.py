"""The request policies' balance contract as admission rules (issue 37, "Balance is part of the
policy's contract").

Contract, for any arrival pattern (sequential, bursty, concurrent), once the stream holds
`BALANCE_FROM` x G requests (N requests so far, m = N / G their per-rank mean):

- requests: every rank's count k[g] within `slack` x m of m, exactly. Guaranteed: the band
  [m - D(N), m + D(N)] with D(N) = max(1, slack x m) is kept from the first request on
  (`admissible_ranks`), so at N = 20 G (D = 1) the counts lie in {m - 1, m, m + 1}. A rank
  may take a request only if the counts stay inside the band and stay *schedulable* in it: for
  every t = 0 .. horizon further requests, the ranks' total shortfall below the band's lower
  edge at N + t is at most t (each request lifts one rank by one). Keeping the most-behind rank
  (fewest requests) always passes this test (earliest deadline first: every rank's lower edge
  is the same), so an admissible rank always exists, and no rank is ever passed over while it
  is below the band.
- tokens: every rank's tokens c[g] within `slack` x the mean M of M, up to one request: the
  contract is |c[g] - M| <= slack x M + n_max (n_max the longest request so far). Exactly
  5 % is impossible for some lengths (one request of 100 x the mean length puts its rank
  ~75 x the mean request above M at G = 4, whoever takes it). `token_excess` is what each
  choice would leave outside two bands, the tokens' own (slack x M + rho x n_max, inside the
  contract) and the projected tokens' (`token_excess`); the policies take a rank with no excess
  when the request band allows one, else the one with the least. This is a property over
  random arrivals (tests/schedule/test_policy_balance.py), not a worst-case theorem: an
  adversary that sees the choices can push the tokens further.

Scores only choose among the ranks these rules admit, so the expert affinity spends the slack.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

BALANCE_SLACK = 0.05    # the contract: per-rank requests / tokens within 5 % of the mean
BALANCE_FROM = 20       # ... once the stream holds 20 x G requests (there 5 % = one request)


def request_band(N: int, G: int, slack: float = BALANCE_SLACK) -> tuple[int, int]:
    """(lowest, highest) request count a rank may hold after N requests: the integers within
    D(N) = max(1, slack x N / G) of the mean N / G."""
    m = N / G
    d = max(1.0, slack * m)

    return math.ceil(m - d - 1e-9), math.floor(m + d + 1e-9)


def request_admissible(k: Sequence[int], g: int, slack: float = BALANCE_SLACK,
                       horizon: int | None = None) -> bool:
    """Whether rank g may take the next request: after it, every count int k[G] is inside the
    band (`request_band`) and the shortfall below the band's lower edge over the next `horizon`
    requests (default 3 G) can still be made up, one rank per request."""
    return admissible_ranks(k, slack, horizon)[g]


def admissible_ranks(k: Sequence[int], slack: float = BALANCE_SLACK,
                     horizon: int | None = None) -> list[bool]:
    """bool[G]: `request_admissible` for every rank at once. The lower edge lo(t) never falls as
    t grows, so the shortfall only needs checking at the first t of each new edge (it is
    constant, and t larger, until the next): O(horizon + G x edges), the router's hot path."""
    G, N = len(k), sum(k) + 1
    hi = request_band(N, G, slack)[1]
    ok = [x + 1 <= hi for x in k]
    last = None
    ceil = math.ceil
    for t in range(0, (3 * G if horizon is None else horizon) + 1):
        m = (N + t) / G                            # request_band's lower edge, inlined
        lo = ceil(m - (slack * m if slack * m > 1.0 else 1.0) - 1e-9)
        if lo == last:
            continue
        last = lo
        short = sum(lo - x for x in k if x < lo)
        # taking the request lifts rank g by one: the shortfall drops by one if g was below lo
        for g in range(G):
            if ok[g] and short - (k[g] < lo) > t:
                ok[g] = False
    return ok


def token_excess(c: Sequence[int], k: Sequence[int], n: int, n_max: int,
                 slack: float = BALANCE_SLACK, rho: float = 0.5,
                 proj_slack: float | None = None) -> list[float]:
    """float[G]: for each rank g, how far (tokens) giving it a request of n tokens leaves the
    ranks outside the token bands, the largest over the ranks (0: inside both). c int[G] tokens
    and k int[G] requests per rank so far; n_max the longest request so far (this one included).

    Two bands around the mean M after the request: the tokens themselves within slack x M +
    rho x n_max, and the *projected* tokens (each rank's tokens once its request count is
    brought to the mean at the stream's mean length, c + (N / G - k) x C / N) within proj_slack
    (default slack) x M. The projection keeps a rank that is behind in requests (the request
    band will force requests on it) from being ahead in tokens: without it tokens drift to 26 %
    above the mean on GPT-OSS-20B. M, N and C do not depend on g, so each rank's figure with and
    without the request is computed once: O(G)."""
    G = len(c)
    C, N = sum(c) + n, sum(k) + 1
    mean, avg, m = C / G, C / N, N / G
    real_band = slack * mean + rho * n_max
    proj_band = (slack if proj_slack is None else proj_slack) * mean

    def out(x: float, y: int) -> float:
        return max(abs(x - mean) - real_band, abs(x + (m - y) * avg - mean) - proj_band, 0.0)

    without = [out(c[h], k[h]) for h in range(G)]
    order = sorted(range(G), key=without.__getitem__, reverse=True)
    top, second = order[0], (order[1] if G > 1 else order[0])
    rest = [without[second] if g == top else without[top] for g in range(G)] if G > 1 else [0.0]
    return [max(out(c[g] + n, k[g] + 1), rest[g]) for g in range(G)]


def contract_ranks(pref: Sequence[int], k: Sequence[int], c: Sequence[int], n: int, n_max: int,
                   slack: float = BALANCE_SLACK, rho: float = 0.5,
                   token_slack: float | None = None) -> list[int]:
    """The ranks of `pref` (a policy's preference order, best first; the router's mask already
    applied) that the contract admits for the next request of n tokens, in `pref`'s order:
    (1) requests, hard: inside the band and schedulable in it (`admissible_ranks`); the rank with
    the fewest requests always passes, so the list is empty only when the mask removed every
    admissible rank (then the fewest requests of `pref`); (2) tokens: those leaving every rank
    inside both token bands (`token_excess`), else those leaving the least outside. k int[G]
    requests and c int[G] tokens per rank so far; n_max the longest request so far, this one
    included. Every policy that declares `balances` chooses among these (issue 45)."""
    band = admissible_ranks(k, slack)
    adm = [g for g in pref if band[g]] or [min(pref, key=lambda g: (k[g], c[g]))]
    ex = token_excess(c, k, n, n_max, slack, rho, token_slack)
    least = max(min(ex[g] for g in adm), 0.0)
    return [g for g in adm if ex[g] <= least]
