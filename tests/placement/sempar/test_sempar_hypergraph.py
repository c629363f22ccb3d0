"""The Mt-KaHyPar start (placement/sempar/hypergraph.py) and `sempar-hypergraph`: planted
clusters recovered by the partitioner alone, N / G experts a device after the repair, the
named method never below `sempar`'s fit objective (it keeps the better start per layer)."""

from __future__ import annotations

import numpy as np
from scipy import sparse

from sempar.placement import solve
from sempar.placement.sempar.hypergraph import equal_counts, hypergraph_start
from test_sempar_solver import planted


def _planted_sets(N=16, G=4, k=3, U=400, seed=0):
    """(C CSR [U, N], weights [U], cluster int[N]): hyperedges inside one cluster of N / G."""
    rng = np.random.default_rng(seed)
    cl = rng.permutation(np.arange(N) // (N // G))
    rows = [rng.choice(np.flatnonzero(cl == rng.integers(G)), k, replace=False) for _ in range(U)]
    w = rng.integers(1, 5, U).astype(np.float64)
    C = sparse.csr_matrix((np.repeat(w, k), (np.repeat(np.arange(U), k), np.concatenate(rows))),
                          shape=(U, N))
    return C, w, cl


def _same_partition(a, b) -> bool:
    return all(len(set(b[a == g])) == 1 for g in np.unique(a))


def test_planted_clusters_recovered_with_equal_counts():
    C, w, cl = _planted_sets()
    for objective in ("km1", "soed", "cut"):
        dev = hypergraph_start(C, w, 4, 0.5, seed=0, objective=objective)   # planted: 1.23
        assert np.bincount(dev, minlength=4).tolist() == [4] * 4
        assert _same_partition(dev, cl), objective


def test_repair_moves_only_what_it_must():
    C, w, cl = _planted_sets()
    bad = cl.copy()
    moved = np.flatnonzero(cl == 0)[0]
    bad[moved] = 1                                       # one device 3 experts, one 5
    fixed = equal_counts(bad, C, w, 4)
    assert np.bincount(fixed, minlength=4).tolist() == [4] * 4
    assert (fixed != bad).sum() == 1 and _same_partition(fixed, cl)


def test_named_method_deterministic_and_not_worse_on_fit():
    trace, _, _ = planted(T=8000, vocab=400, R=80)
    a = solve("sempar-hypergraph", trace, num_devices=4, seed=3)
    b = solve("sempar-hypergraph", trace, num_devices=4, seed=3)
    base = solve("sempar", trace, num_devices=4, seed=3)
    assert np.array_equal(a.phy2log, b.phy2log) and a.method == "sempar-hypergraph"
    assert sum(a.info["fit_local_activations"]) >= sum(base.info["fit_local_activations"]) - 1e-6
