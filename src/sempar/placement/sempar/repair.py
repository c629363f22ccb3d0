"""Balance repair against held-out load scenarios (ours, issue 45; not in the papers).

The fit cap balances the fit loads; on new requests a device's load moves with the requests
that use its experts (held_out.py). At a fit cap of 1.0 the held-out imbalance of a few-request
fit can still be above the target: the cap has nothing left to give, the grouping itself
drifts. The repair swaps experts between devices (R = 0: one slot each, the slot counts kept)
to lower the imbalance the placement is predicted to have on new requests, paying as little
locality as it can:

- scenarios: `replicates` request bootstrap replicates of the fit loads (weights w float[B, R],
  a seed of its own, not the prediction's), each replicate's deviation from the fit expert
  loads scaled by sqrt(`inflation`) as held_out.py's prediction scales it: per layer
  E float[B, N] expert loads, device loads D = E grouped, the layer's figure the mean over
  scenarios of max_g D / mean (held_out.imbalance's per-layer term, in expectation);
- locality: a pair-affinity proxy of the locality a swap loses: tp mode, rows that activate
  both experts (C = M^T M, M the fit rows' expert indicator); dp mode, request co-use
  C = A^T diag(1 / t) A (A float[R, N] a request's activations of each expert, t its total);
  a device's locality is the sum of C over its expert pairs;
- greedy: each step takes, over all layers, the swap with the most imbalance gained per
  locality lost (a swap that gains imbalance and locality first), until the mean over layers is
  at most `goal`, no swap lowers a layer's figure, the locality lost would pass `budget` (a
  share of the placement's own proxy locality: an unreachable goal must not trade away the
  placement) or `max_swaps` swaps are made.

Shapes: L layers, N experts, G devices, S = N / G slots each, R fit requests, B scenarios.
"""

from __future__ import annotations

import numpy as np

from sempar.placement.placement import Placement
from sempar.trace.schema import RoutingTrace


def _layer_inputs(trace: RoutingTrace, l: int, N: int, ridx: np.ndarray, R: int, mode: str
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(A float64[R, N] request x expert activations at layer l, C float64[N, N] the
    locality proxy of `mode`, its diagonal zero)."""
    ex = np.asarray(trace.experts[:, l], np.int64)                      # [T, k]
    A = np.zeros((R, N))
    np.add.at(A, (np.repeat(ridx, ex.shape[1]), ex.ravel()), 1.0)
    if mode == "dp":
        C = A.T @ (A / np.maximum(A.sum(axis=1, keepdims=True), 1.0))
    else:
        M = np.zeros((ex.shape[0], N), np.float32)
        M[np.repeat(np.arange(ex.shape[0]), ex.shape[1]), ex.ravel()] = 1.0
        C = (M.T @ M).astype(np.float64)
    np.fill_diagonal(C, 0.0)
    return A, C


class _Layer:
    """One layer's scenarios, grouping and figures (module docstring)."""

    def __init__(self, E: np.ndarray, C: np.ndarray, dev: np.ndarray, G: int):
        self.E, self.C, self.dev, self.G = E, C, dev.copy(), G
        self.mean = E.sum(axis=1, keepdims=True) / G                    # [B, 1]

    def loads(self) -> np.ndarray:
        """float64[B, G]: device loads per scenario."""
        oh = np.zeros((self.dev.size, self.G))
        oh[np.arange(self.dev.size), self.dev] = 1.0
        return self.E @ oh

    def locality(self) -> float:
        """The proxy locality: C summed over the pairs of experts that share a device."""
        same = self.dev[:, None] == self.dev[None, :]
        return float(self.C[same].sum())

    def figure(self) -> float:
        return float((self.loads().max(axis=1, keepdims=True) / self.mean).mean())

    def best_swap(self) -> tuple[float, float, int, int]:
        """(imbalance gained, locality lost, e1, e2) of the swap with the best ratio among
        the swaps that gain imbalance; gain 0 when none does."""
        D = self.loads()                                                # [B, G]
        B, G, dev = D.shape[0], self.G, self.dev
        # the max over the devices other than a pair (d1, d2): from each scenario's top 3
        order = np.argsort(-D, axis=1)[:, :3]                           # [B, 3]
        top = np.take_along_axis(D, order, axis=1)
        others = np.empty((B, G, G))
        for d1 in range(G):
            for d2 in range(G):
                ok = (order != d1) & (order != d2)
                first = ok.argmax(axis=1)
                others[:, d1, d2] = np.where(ok.any(axis=1), top[np.arange(B), first], 0.0)
        cur = (D.max(axis=1, keepdims=True) / self.mean).mean()
        d1, d2 = dev[:, None], dev[None, :]                             # e1 -> d2, e2 -> d1
        delta = self.E[:, None, :] - self.E[:, :, None]                 # [B, e1, e2]: E[e2] - E[e1]
        new1 = D[:, dev][:, :, None] + delta                            # device of e1
        new2 = D[:, dev][:, None, :] - delta                            # device of e2
        peak = np.maximum(np.maximum(new1, new2), others[:, d1, d2])
        fig = (peak / self.mean[:, :, None]).mean(axis=0)               # [N, N]
        gain = cur - fig
        CD = np.zeros((dev.size, G))
        np.add.at(CD.T, dev, self.C)                                    # CD[e, g] = sum C[e, g's]
        own = CD[np.arange(dev.size), dev]                              # C[e, own device]
        lost = (own[:, None] - CD[np.arange(dev.size)[None, :], dev[:, None]] + self.C
                + own[None, :] - CD[np.arange(dev.size)[:, None], dev[None, :]] + self.C)
        gain[d1 == d2] = 0.0
        score = np.where(gain > 1e-9, gain / np.maximum(lost, 1e-9), -np.inf)
        score[(gain > 1e-9) & (lost <= 0)] = np.inf
        e1, e2 = np.unravel_index(int(np.argmax(score)), score.shape)
        if not np.isfinite(score[e1, e2]) and score[e1, e2] < 0:
            return 0.0, 0.0, -1, -1
        return float(gain[e1, e2]), float(lost[e1, e2]), int(e1), int(e2)


def repair(placement: Placement, trace: RoutingTrace, mode: str, inflation: float, goal: float,
           replicates: int = 50, seed: int = 0, max_swaps: int = 200,
           budget: float = 0.03) -> dict:
    """Swap experts of `placement` (R = 0; changed in place) until the scenarios' mean
    imbalance is at most `goal` (module docstring); trace: the fit (row) trace it was solved
    on. Returns {"swaps", "before", "after"} (the scenarios' figures)."""
    L, N, G = placement.num_layers, placement.num_experts, placement.num_devices
    reqs, ridx = np.unique(trace.request_id, return_inverse=True)
    R = reqs.size
    rng = np.random.default_rng(seed + 7919)           # not the prediction's replicates
    w = rng.multinomial(R, np.full(R, 1.0 / R), size=replicates).astype(np.float64)
    k = float(np.sqrt(max(inflation, 0.0)))
    layers = []
    for l in range(L):
        A, C = _layer_inputs(trace, l, N, ridx, R, mode)
        fit = A.sum(axis=0)
        S = w @ A
        S *= fit.sum() / np.maximum(S.sum(axis=1, keepdims=True), 1e-12)
        dev = np.empty(N, np.int64)
        dev[placement.phy2log[l]] = np.repeat(np.arange(G), placement.slots_per_device)
        layers.append(_Layer(fit + k * (S - fit), C, dev, G))
    total = sum(x.locality() for x in layers)
    spent = 0.0
    figs = np.array([x.figure() for x in layers])
    before = float(figs.mean())
    cand = [x.best_swap() for x in layers]
    swaps = 0
    while figs.mean() > goal and swaps < max_swaps:
        ratio = [g / max(lo, 1e-9) if g > 1e-9 else -1.0 for g, lo, _, _ in cand]
        l = int(np.argmax(ratio))
        if ratio[l] < 0:
            break
        _, lost, e1, e2 = cand[l]
        if spent + max(lost, 0.0) > budget * total:
            break
        spent += lost
        x = layers[l]
        x.dev[e1], x.dev[e2] = x.dev[e2], x.dev[e1]
        row = placement.phy2log[l]
        i1, i2 = int(np.flatnonzero(row == e1)[0]), int(np.flatnonzero(row == e2)[0])
        row[i1], row[i2] = e2, e1
        figs[l] = x.figure()
        cand[l] = x.best_swap()
        swaps += 1
    return {"swaps": swaps, "before": round(before, 4), "after": round(float(figs.mean()), 4),
            "locality_lost": round(spent / max(total, 1e-12), 4)}
