"""Replica slots for locality (placement/replica_locality.py, `ReplicaPass.locality`): the gain
is the brute-force change of the tokens' local activations, and the pass with locality keeps
the peak it reaches without it (within its tolerance) while serving more activations home."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.placement.dispatch_peak import ReplicaPass, min_peak, replica_pass
from sempar.placement.placement import Placement
from sempar.placement.replica_locality import local_gain, token_experts

G, N, S = 4, 16, 5
PHY2LOG = np.concatenate([np.r_[np.arange(d, N, G), (d + 1) % G] for d in range(G)])


def _local(row: np.ndarray, ex: np.ndarray) -> int:
    """Brute force: per token, the most of its experts one device holds, summed."""
    held = [set(row[g * S:(g + 1) * S].tolist()) for g in range(G)]
    return sum(max(len(held[g] & set(t.tolist())) for g in range(G)) for t in ex)


def _pairs(seed: int, T: int = 1500):
    """Tokens of two experts each, most pairs across devices (expert e lives on e % G)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, N, T)
    b = (a + 1 + rng.integers(0, 3, T)) % N
    return np.stack([a, b], axis=1)


@pytest.mark.parametrize("seed", range(3))
def test_local_gain_is_the_brute_force_change(seed):
    ex = _pairs(seed, T=300)
    inE = token_experts(ex, N)
    cnt = np.bincount(PHY2LOG, minlength=N)
    slots = np.flatnonzero(cnt[PHY2LOG] > 1)
    cand = [(p, e) for p in slots for e in range(N)
            if e not in set(PHY2LOG[(p // S) * S:(p // S + 1) * S].tolist())]
    p = np.array([c[0] for c in cand])
    b = np.array([c[1] for c in cand])
    gain = local_gain(PHY2LOG, G, inE, p, b)
    base = _local(PHY2LOG, ex)
    for i in np.random.default_rng(seed).choice(len(cand), 12, replace=False):
        row = PHY2LOG.copy()
        row[p[i]] = b[i]
        assert gain[i] == _local(row, ex) - base


def test_replica_pass_with_locality_keeps_the_peak_and_serves_more_home():
    ex = _pairs(0)
    loads = np.bincount(ex.ravel(), minlength=N).astype(float)[None, None]     # [1, 1, N]
    tokens = ex[:, None, :]                                                    # [T, L=1, k]
    phy = PHY2LOG[None]
    plain, m0 = replica_pass(phy, G, loads, np.ones(1), ReplicaPass(max_moves=4))
    loc, m1 = replica_pass(phy, G, loads, np.ones(1), ReplicaPass(max_moves=4, locality=0.01,
                                                                  locality_free=True),
                           tokens=tokens)
    Placement(loc, N, G).validate()
    assert 0 < m1 <= 4
    assert float(min_peak(loc[0], loads[0], G)[0]) <= \
        float(min_peak(plain[0], loads[0], G)[0]) + 0.01 * m1 + 1e-9
    assert _local(loc[0], ex) > _local(plain[0], ex)
    # without tokens the knob changes nothing
    same, _ = replica_pass(phy, G, loads, np.ones(1), ReplicaPass(max_moves=4, locality=0.01))
    assert (same == plain).all()


def test_replica_pass_without_free_moves_moves_only_to_lower_the_peak():
    """`locality` alone re-chooses among retargets that lower the worst peak: none where the
    peak is already even, and on a hot load it lowers the peak as the plain pass does (within
    the tolerance per move)."""
    ex = _pairs(1)
    tokens = ex[:, None, :]
    even = np.bincount(ex.ravel(), minlength=N).astype(float)[None, None]
    cfg = ReplicaPass(max_moves=4, locality=0.01)
    same, moved = replica_pass(PHY2LOG[None], G, even, np.ones(1), cfg, tokens=tokens)
    assert moved == 0 or \
        float(min_peak(same[0], even[0], G)[0]) < float(min_peak(PHY2LOG, even[0], G)[0])
    free, m2 = replica_pass(PHY2LOG[None], G, even, np.ones(1),
                            ReplicaPass(max_moves=4, locality=0.01, locality_free=True),
                            tokens=tokens)
    assert m2 > moved and _local(free[0], ex) > _local(same[0], ex)
    hot = even.copy()
    hot[0, 0, [0, 4, 8]] *= 4.0                       # three hot experts on device 0
    plain, m0 = replica_pass(PHY2LOG[None], G, hot, np.ones(1), ReplicaPass(max_moves=4))
    loc, m1 = replica_pass(PHY2LOG[None], G, hot, np.ones(1), cfg, tokens=tokens)
    Placement(loc, N, G).validate()
    before = float(min_peak(PHY2LOG, hot[0], G)[0])
    assert 0 < m1 <= 4 and float(min_peak(loc[0], hot[0], G)[0]) < before
    assert float(min_peak(loc[0], hot[0], G)[0]) <= \
        float(min_peak(plain[0], hot[0], G)[0]) + 0.01 * m1 + 1e-9
