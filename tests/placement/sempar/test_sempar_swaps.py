"""The expert step's swap search (placement/sempar/experts.py) keeps its pair scores and
rescans only the rows and columns a swap touched: it must pick the same swaps as a full rescan
of every pair after every swap (the search before issue 46's speed-up, kept here as the
reference), bit for bit, with and without the robust margin, on the default and the scaled
load model, in the overload phase (an infeasible start) and the gain phase, with groups."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.placement.sempar.experts import _swap_search
from sempar.placement.sempar.load import LoadModel, load_spread
from sempar.placement.sempar.scale import ScaledLoadModel


def _swapped_reference(lm: LoadModel, dev: np.ndarray, G: int):
    """Robust loads of dev[e1] and dev[e2] after swapping e1, e2: float[N, N] each (the
    formulas the search used to evaluate on all pairs every scan)."""
    load, N = lm.load, dev.size
    L = np.bincount(dev, weights=load, minlength=G)
    d = load[None, :] - load[:, None]
    L1, L2 = L[dev][:, None] + d, L[dev][None, :] - d
    if lm.sigma is None:
        return L1, L2
    Sg = lm.sigma
    S = lm.by_device(dev, G)
    ar = np.arange(N)
    V = np.bincount(dev, weights=S[ar, dev], minlength=G)
    own = S[ar, dev]
    cross = S[:, dev]
    diag = np.diag(Sg)
    V1 = (V[dev][:, None] - 2 * own[:, None] + diag[:, None] + 2 * cross.T
          - 2 * Sg + diag[None, :])
    V2 = (V[dev][None, :] - 2 * own[None, :] + diag[None, :] + 2 * cross
          - 2 * Sg + diag[:, None])
    return (L1 + np.sqrt(np.maximum(V1, 0.0)) - lm.offset,
            L2 + np.sqrt(np.maximum(V2, 0.0)) - lm.offset)


def _reference(W, lm, dev, expert_group, max_swaps):
    """The full rescan: every pair scored again after every swap."""
    G, N = W.shape
    cap = lm.cap
    ar = np.arange(N)
    same = expert_group[:, None] == expert_group[None, :]
    path = []
    for _ in range(max_swaps):
        L = lm.of(dev, G)
        own = W[dev, ar]
        cross = W[dev][:, ar]
        gain = cross + cross.T - own[:, None] - own[None, :]
        L1, L2 = _swapped_reference(lm, dev, G)
        valid = same & (dev[:, None] != dev[None, :])
        over = np.maximum(L - cap, 0.0)
        if over.sum() > 1e-9:
            o_old = over[dev][:, None] + over[dev][None, :]
            o_new = np.maximum(L1 - cap, 0.0) + np.maximum(L2 - cap, 0.0)
            cut = np.where(valid, o_old - o_new, 0.0)
            if cut.max() <= 1e-9:
                return dev, path
            score = np.where(cut > 1e-9, gain / 1e6 + cut, -np.inf)
        else:
            score = np.where(valid & (L1 <= cap) & (L2 <= cap) & (gain > 1e-9), gain, -np.inf)
        e1, e2 = divmod(int(np.argmax(score)), N)
        if not np.isfinite(score[e1, e2]):
            return dev, path
        dev[e1], dev[e2] = dev[e2], dev[e1]
        path.append((e1, e2))
    return dev, path


def _instance(seed: int, G: int, N: int, groups: int, sigma: str, cap: float):
    rng = np.random.default_rng(seed)
    R = 60
    X = rng.poisson(rng.gamma(0.6, 3.0, (1, N)) * rng.gamma(1.0, 1.0, (R, 1)), (R, N))
    X = X.astype(np.float64) + 0.01
    load = X.sum(axis=0)
    W = rng.gamma(0.5, 10.0, (G, N)).astype(np.float32)
    cls = {"none": LoadModel, "plain": LoadModel, "scaled": ScaledLoadModel}[sigma]
    lm = cls(load, None if sigma == "none" else load_spread(X, load), cap * load.sum() / G, G,
             robust=2.0)
    expert_group = np.arange(N) // (N // groups)
    dev = np.empty(N, np.int64)
    for g in range(groups):           # each group's experts spread over every device
        members = np.flatnonzero(expert_group == g)
        dev[members] = rng.permutation(np.arange(members.size) % G)
    return W, lm, dev, expert_group


@pytest.mark.parametrize("sigma", ["none", "plain", "scaled"])
@pytest.mark.parametrize("G,N,groups", [(4, 32, 1), (8, 64, 2), (16, 64, 1)])
@pytest.mark.parametrize("cap", [1.02, 1.3])     # 1.02: starts overloaded, the cut phase first
def test_incremental_swaps_equal_full_rescan(sigma, G, N, groups, cap):
    for seed in range(3):
        W, lm, dev, eg = _instance(seed, G, N, groups, sigma, cap)
        ref, path = _reference(W, lm, dev.copy(), eg, 4 * N)
        got = _swap_search(W, lm, dev.copy(), eg, 4 * N)
        assert path, "the instance makes no swap: nothing compared"
        np.testing.assert_array_equal(got, ref)
