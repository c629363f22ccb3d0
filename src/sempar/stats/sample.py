"""The seeded sample of whole requests that a fit trace is cut to: the same set whether it is
drawn from the whole trace or merged from the samples of its shards.

Rule (ours; a bottom-k sketch with a row budget): every request id r gets a priority
h(r) = splitmix64(r XOR mix(seed)), a fixed pseudo-random uint64 (no state, no order: the
same id has the same priority in every shard and every process). The sample is the longest
prefix of the requests sorted by (priority, id) whose rows add up to at most `max_rows`, and
at least the first request (which alone may be longer). It is a uniform random sample of
requests (the priorities are i.i.d. uniform for distinct ids), seeded, and **mergeable**: a
request in the whole trace's prefix is in its shard's prefix too (the shard's requests before
it are a subset of the whole trace's), so the whole trace's sample is the same rule applied
to the union of the shards' samples, restricted to the requests ordered before every shard's
first left-out request (`cut_after`): below the lowest such cut the union holds every request,
so its running row counts are the whole trace's (`stats.routing_stats`). Requests must not
straddle shards.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """uint64[n]: splitmix64's finaliser of x uint64[n] (a bijection with good avalanche)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def request_priority(request_id: np.ndarray, seed: int) -> np.ndarray:
    """uint64[n]: the sampling priority of each request id (int[n]) under `seed`."""
    key = _splitmix(np.asarray([seed & (2**64 - 1)], np.uint64))[0]
    return _splitmix(np.asarray(request_id).astype(np.int64).view(np.uint64) ^ key)


def bottom_requests(priority: np.ndarray, request_id: np.ndarray, rows: np.ndarray,
                    max_rows: int) -> np.ndarray:
    """int64[m]: indices (into the three arrays, one entry per distinct request) of the sampled
    requests: the prefix by (priority, id) of at most `max_rows` rows, at least one request."""
    order = np.lexsort((request_id, priority))
    keep = int(np.searchsorted(np.cumsum(rows[order]), max_rows, side="right"))
    return np.sort(order[:max(1, keep)])


def cut_after(priority: np.ndarray, request_id: np.ndarray, chosen: np.ndarray
              ) -> tuple[int, int] | None:
    """(priority, id) of the first request the sample rule left out (the requests are the
    three arrays' entries, `chosen` the kept indices from `bottom_requests`), None when none was:
    every request ordered below it is in the sample, which merging needs (`stats.routing_stats`)."""
    out = np.ones(priority.size, bool)
    out[chosen] = False
    if not out.any():
        return None
    i = np.flatnonzero(out)
    j = i[np.lexsort((request_id[i], priority[i]))[0]]
    return int(priority[j]), int(request_id[j])


def below(priority: np.ndarray, request_id: np.ndarray, cut: tuple[int, int] | None) -> np.ndarray:
    """bool[n]: which requests are ordered before `cut` (all when None)."""
    if cut is None:
        return np.ones(priority.size, bool)
    p = np.uint64(cut[0])
    return (priority < p) | ((priority == p) & (request_id < cut[1]))


def sample_requests(request_id: np.ndarray, max_rows: int, seed: int) -> np.ndarray:
    """int64[T'] rows (in trace order) of the sampled whole requests (module docstring); every
    row when the trace holds at most `max_rows`. request_id: int[T]."""
    T = request_id.shape[0]
    if T <= max_rows:
        return np.arange(T)
    reqs, inv, size = np.unique(request_id, return_inverse=True, return_counts=True)
    pick = bottom_requests(request_priority(reqs, seed), reqs, size, max_rows)
    keep = np.zeros(reqs.size, bool)
    keep[pick] = True
    return np.flatnonzero(keep[inv])
