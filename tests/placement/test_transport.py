"""placement.transport: the optimal capacity-bound home assignment, checked against enumeration
of every assignment on tiny batches, against the greedy proposal rounds, and on its caps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sempar.placement.capacity import (ASSIGN_RULES, SEARCH_ASSIGN, capacity_home,
                                       proposal_assign, slack_shares)
from sempar.placement.transport import optimal_assign, row_types, transport_counts


def _brute(hits: np.ndarray, caps: np.ndarray) -> int:
    """The most total hits of any assignment of the n items within caps (every one listed)."""
    n, G = hits.shape
    best = -1
    for homes in itertools.product(range(G), repeat=n):
        if (np.bincount(homes, minlength=G) <= caps).all():
            best = max(best, int(hits[np.arange(n), homes].sum()))
    return best


def _value(hits: np.ndarray, home: np.ndarray) -> int:
    return int(hits[np.arange(hits.shape[0]), home].sum())


@pytest.mark.parametrize("seed", range(40))
def test_optimum_matches_enumeration_and_beats_the_greedy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, G = int(rng.integers(2, 8)), int(rng.integers(2, 4))
    k = int(rng.integers(1, 4))
    # hit rows as a placement makes them: k experts spread over G devices (small ints)
    hits = np.stack([np.bincount(rng.integers(0, G, k), minlength=G) for _ in range(n)])
    slack = [0.0, 0.3][seed % 2]
    caps = slack_shares(n, G, slack)
    home = optimal_assign(hits, caps)
    assert home.shape == (n,) and home.dtype == np.int64
    assert (np.bincount(home, minlength=G) <= caps).all()
    if slack == 0.0:                                 # equal shares: every device exactly full
        assert (np.bincount(home, minlength=G) == caps).all()
    assert _value(hits, home) == _brute(hits, caps)
    assert _value(hits, home) >= _value(hits, proposal_assign(hits, caps))


def test_greedy_leaves_hits_the_optimum_takes() -> None:
    # device 0 is everyone's best; the greedy keeps item 0 (priority 2, earlier) there and sends
    # item 1 to its next best (device 1: 0 hits); the optimum keeps item 1 at 0 (2 hits) and
    # moves item 0 to device 1 where it still has 2 hits
    hits = np.array([[2, 2], [2, 0]])
    caps = np.array([1, 1])
    assert _value(hits, proposal_assign(hits, caps)) == 2
    assert optimal_assign(hits, caps).tolist() == [1, 0]


def test_chain_of_moves() -> None:
    # device 0 is one over; the only loss-free fix moves item 1 to device 1 and item 2 (sitting
    # on device 1) on to device 2: a two-move chain
    hits = np.array([[3, 0, 0], [2, 2, 0], [0, 3, 3], [0, 0, 0]])
    caps = np.array([1, 1, 2])
    home = optimal_assign(hits, caps)
    assert _value(hits, home) == _brute(hits, caps) == 8


def test_row_types_and_counts() -> None:
    hits = np.array([[1, 0], [0, 1], [1, 0]])
    types, inv = row_types(hits)
    assert types[inv].tolist() == hits.tolist()
    x = transport_counts(types, np.bincount(inv), np.array([2, 1]))
    assert x.sum(axis=1).tolist() == np.bincount(inv).tolist()
    with pytest.raises(ValueError):
        transport_counts(types, np.bincount(inv), np.array([1, 1]))
    assert optimal_assign(np.zeros((0, 3), np.int64), np.zeros(3, np.int64)).size == 0


def test_capacity_home_by_rule_per_batch() -> None:
    rng = np.random.default_rng(0)
    hits = np.stack([np.bincount(rng.integers(0, 4, 4), minlength=4) for _ in range(300)])
    greedy = capacity_home(hits, 64, rule="proposal")
    best = capacity_home(hits, 64)                           # the default rule (issue 46)
    for lo in range(0, 300, 64):
        sl = slice(lo, lo + 64)
        n = hits[sl].shape[0]
        assert (np.bincount(best[sl], minlength=4) == slack_shares(n, 4)).all()
        assert _value(hits[sl], best[sl]) >= _value(hits[sl], greedy[sl])
    assert ASSIGN_RULES.names() == ["proposal", "optimal"]
    assert capacity_home(hits, 64, rule="optimal").tolist() == best.tolist()
    assert capacity_home(hits, 64, rule=SEARCH_ASSIGN).tolist() == greedy.tolist()
