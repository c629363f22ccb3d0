"""The least peak a balancing dispatch reaches on a layout (placement/dispatch_peak.py) is the
one the `lp` rule serves; the replica pass lowers the worst scenario's peak and keeps the
placement's invariants; `lp-cap` keeps every batch within its cap where `lp` can, with at least
`lp`'s locality."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.placement.dispatch import LP_CAP, dispatch
from sempar.placement.dispatch_peak import ReplicaPass, min_peak, replica_pass
from sempar.placement.placement import Placement

G, N, S = 4, 16, 5
PHY2LOG = np.concatenate([np.r_[np.arange(d, N, G), (d + 1) % G] for d in range(G)])


def _routing(seed: int, T: int = 3000, hot: float = 3.0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(N)) + np.r_[np.zeros(N - 2), [hot, hot]] / N
    ex = np.stack([rng.choice(N, 2, replace=False, p=p / p.sum()) for _ in range(T)])
    return ex, rng.integers(0, G, T)


@pytest.mark.parametrize("seed", range(4))
def test_min_peak_is_what_lp_serves(seed):
    ex, home = _routing(seed)
    served = dispatch("lp", ex, home, PHY2LOG, G)
    load = np.bincount(served.ravel(), minlength=G)
    want = float(min_peak(PHY2LOG, np.bincount(ex.ravel(), minlength=N), G)[0])
    assert load.max() / load.mean() == pytest.approx(want, abs=2 * G / load.sum())


def test_min_peak_of_single_copies_is_the_plain_peak():
    w = np.arange(1.0, N + 1)
    dev = np.bincount(np.arange(N) // (N // G), w, minlength=G)
    assert min_peak(np.arange(N), w, G)[0] == pytest.approx(dev.max() / dev.mean())
    # a second copy on the same device (an engine's map) adds no way out
    row = np.hstack([np.arange(N).reshape(G, -1), np.arange(G)[:, None] * (N // G)]).ravel()
    assert min_peak(row, w, G)[0] == pytest.approx(dev.max() / dev.mean())


def test_replica_pass_lowers_the_worst_window_and_keeps_the_invariants():
    loads = []
    for seed in range(3):                # three windows with different hot experts
        ex, _ = _routing(seed, hot=6.0)
        loads.append(np.bincount(ex.ravel(), minlength=N).astype(float))
    loads = np.stack([np.stack(loads)] * 2)                           # [L=2, H=3, N]
    phy = np.stack([PHY2LOG, PHY2LOG])
    caps = np.ones(3)
    before = max(float(min_peak(PHY2LOG, loads[0], G).max()), 1.0)
    new, moved = replica_pass(phy, G, loads, caps, ReplicaPass(max_moves=3))
    assert 0 < moved <= 6
    Placement(new, N, G).validate()                                   # hosts, slots, no twins
    assert (np.bincount(new[0], minlength=N) >= 1).all()
    after = float(min_peak(new[0], loads[0], G).max())
    assert after < before
    assert ((new != phy).sum(axis=1) <= 3).all()                      # one slot per move
    same, none = replica_pass(phy, G, loads, caps, ReplicaPass(max_moves=0))
    assert none == 0 and (same == phy).all()


def test_replica_pass_slack_raises_a_scenarios_cap():
    """`slack`: added to every scenario's cap, the target's included; a scenario whose peak is
    within its raised cap sets no move, so a slack past every peak leaves the layout alone."""
    loads = []
    for seed in range(3):
        ex, _ = _routing(seed, hot=6.0)
        loads.append(np.bincount(ex.ravel(), minlength=N).astype(float))
    loads = np.stack(loads)[None]                                     # [L=1, H=3, N]
    peak = float(min_peak(PHY2LOG, loads[0], G).max())
    assert peak > 1.0
    _, moved = replica_pass(PHY2LOG[None], G, loads, np.ones(3), ReplicaPass(max_moves=2))
    assert moved > 0
    same, none = replica_pass(PHY2LOG[None], G, loads, np.ones(3), ReplicaPass(max_moves=2),
                              slack=np.full(3, peak))
    assert none == 0 and (same == PHY2LOG).all()


@pytest.mark.parametrize("seed", range(3))
def test_lp_cap_within_its_cap_where_lp_is_and_more_local(seed):
    ex, home = _routing(seed, T=2000, hot=1.0)
    batch = np.arange(ex.shape[0]) // 500
    lp = dispatch("lp", ex, home, PHY2LOG, G, batch)
    cap = dispatch("lp-cap", ex, home, PHY2LOG, G, batch)
    for b in range(4):
        m = batch == b
        lo = np.bincount(lp[m].ravel(), minlength=G)
        hi = np.bincount(cap[m].ravel(), minlength=G)
        bound = max(LP_CAP * hi.mean(), lo.max())
        assert hi.max() <= bound + 2                                  # rounding per expert
    hm = home[:, None]
    assert (cap == hm).mean() >= (lp == hm).mean()
