"""A multilevel hypergraph partition (Mt-KaHyPar) as a start of `sempar`'s alternation.

The placement of one tp layer is balanced hypergraph partitioning: experts are vertices weighted
by their load, each item of the layer (a distinct top-k expert set on the `rows` objective,
row_sets.py; a token id on the `tokens` objective) is a hyperedge over the experts it activates,
weighted by its occurrences, and devices are the blocks. Exact-home LAR counts, per hyperedge,
its pins in the block that holds most of them, so it rises as the hyperedges span fewer blocks:
the connectivity objectives of the partitioning literature (km1 = sum_e w_e (lambda_e - 1),
soed = km1 + cut, cut = hyperedges spanning more than one block) all pull the same way, none is
the LAR itself. Mt-KaHyPar (Gottesbüren, Heuer, Sanders, Schlag et al., "Scalable High-Quality
Hypergraph Partitioning", ACM TOPS 2024; `mtkahypar` on PyPI) minimises them with multilevel
coarsening, initial partitioning and FM / flow refinement under a load-balance cap.

Used here (ours, `SemparConfig.hypergraph_start`): the partition, repaired to N / G experts a
device (`graph_baselines.fix_expert_counts`, moving the experts with the least hyperedge
affinity lost), is a second start of the alternation beside METIS; the alternation's exact
steps then refine it on the real objective under the real load model (the expert step enforces
the fit cap, so the partitioner's epsilon only guides it), and the better of the two by the fit
objective is kept. Deterministic: one thread, seeded.
"""

from __future__ import annotations

import os

import numpy as np
from scipy import sparse

from sempar.errors import check_choice
from sempar.placement.graph_baselines import fix_expert_counts

OBJECTIVES = ("km1", "soed", "cut")
PRESETS = ("deterministic", "default", "quality")

_INIT: dict[int, object] = {}        # one Mt-KaHyPar initialisation per process (forked workers)


def _initializer():
    """This process's `mtkahypar.Initializer` (one thread: the layers are the parallel unit)."""
    import mtkahypar

    pid = os.getpid()
    if pid not in _INIT:
        _INIT[pid] = mtkahypar.initialize(1, False)
    return _INIT[pid]


def partition(C: sparse.csr_matrix, weight: np.ndarray, G: int, epsilon: float, seed: int,
              objective: str = "km1", preset: str = "default") -> np.ndarray:
    """int64[N]: Mt-KaHyPar's block of each expert (not yet N / G per block).

    C [U, N] CSR: item u activates expert e where C[u, e] > 0 (the hyperedge's pins);
    weight float[U]: occurrences of item u (the hyperedge weight, rounded, at least 1); the
    vertex weight is the expert's load C.sum(axis=0), the blocks' cap (1 + epsilon) x the mean.
    """
    import mtkahypar

    check_choice("hypergraph objective", objective, OBJECTIVES)
    check_choice("hypergraph preset", preset, PRESETS)
    U, N = C.shape
    if G <= 1:
        return np.zeros(N, np.int64)
    C = sparse.csr_matrix(C)
    C.eliminate_zeros()
    keep = np.flatnonzero(np.diff(C.indptr) >= 2)          # single-pin hyperedges never cut
    load = np.maximum(np.rint(np.asarray(C.sum(axis=0)).ravel()), 1).astype(np.int64)
    ini = _initializer()
    ctx = ini.context_from_preset(getattr(mtkahypar.PresetType, preset.upper()))
    ctx.logging = False
    ctx.set_partitioning_parameters(G, max(float(epsilon), 1e-3),
                                    getattr(mtkahypar.Objective, objective.upper()))
    mtkahypar.set_seed(int(seed) % 2**31)
    edges = [C.indices[C.indptr[u]:C.indptr[u + 1]].tolist() for u in keep]
    w = np.maximum(np.rint(np.asarray(weight, np.float64)[keep]), 1).astype(np.int64)
    if not edges:
        return np.arange(N, dtype=np.int64) % G
    hg = ini.create_hypergraph(ctx, N, len(edges), edges, load.tolist(), w.tolist())
    return np.asarray(hg.partition(ctx).get_partition(), np.int64)


def equal_counts(part: np.ndarray, C: sparse.csr_matrix, weight: np.ndarray,
                 G: int) -> np.ndarray:
    """int64[N]: `part` with exactly N / G experts per block, the experts moved being those
    that lose the least hyperedge affinity (aff[e, d]: occurrence-weighted pins of e's
    hyperedges on block d, e itself left out)."""
    N = part.size
    B = (sparse.csr_matrix(C) > 0).astype(np.float64)                     # [U, N] pins
    P = np.zeros((N, G))
    P[np.arange(N), part] = 1.0
    on = np.asarray(B @ P)                                                # [U, G] pins per block
    aff = np.asarray(B.multiply(np.asarray(weight, np.float64)[:, None]).T @ on)   # [N, G]
    deg = np.asarray(B.multiply(np.asarray(weight, np.float64)[:, None]).sum(axis=0)).ravel()
    aff[np.arange(N), part] -= deg                                        # e is not its own pin
    return fix_expert_counts(part, aff, N // G)[0]


def hypergraph_start(C: sparse.csr_matrix, weight: np.ndarray, G: int, epsilon: float,
                     seed: int, objective: str = "km1", preset: str = "default") -> np.ndarray:
    """int64[N]: the repaired partition (module docstring), N / G experts on each device."""
    return equal_counts(partition(C, weight, G, epsilon, seed, objective, preset), C, weight, G)
