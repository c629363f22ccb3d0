"""The optimal capacity-bound home assignment of one batch: a transportation problem (ours).

Sem-MoE's align step (App. B.2, Alg. 3 line 5: `align(g_shf_indices)`) sends each token to its
device while every device keeps an equal share of the batch; which tokens a full device gives
up, and where they go, the paper leaves open (s-MoE's Alg. 2 re-batching is the same step).
`capacity.py`'s `proposal_rounds` is one greedy answer. This module solves the step exactly:
given hits int[n, G] (item i's local activations on device g) and caps int[G] (sum >= n),

    max  sum_i hits[i, home_i]   s.t.  |{i : home_i = g}| <= caps[g]   (= when sum caps = n)

— the most local activations any home assignment meeting the caps reaches, so the
capacity-bound oracle / reachable LAR of docs/design.md ("Oracle LAR", "Reachable LAR") becomes
"what perfect data scheduling could reach" in the strict sense.

How: items with identical hit rows are interchangeable, so the problem is a transportation
problem on R distinct rows (R <= n; small, because hit rows hold small integers summing to k)
and G devices, x[r, g] = how many items of row type r go to device g. Its constraint matrix is
a bipartite incidence matrix (totally unimodular), so integral counts and caps have an integral
optimum; `transport_counts` solves it as a min-cost flow (types -> devices -> one sink) with
OR-Tools' `SimpleMinCostFlow`, in integers throughout. Measured against the successive-shortest-
path solver this module used before (2026-12-07, the shipped real traces, every 4th layer's
2,048-token batches, `vanilla` placement; both reached the same optimum in every batch): 0.13 /
1.5 ms a batch against 0.38 / 2.6 ms (DeepSeek-V2-Lite EP 4 / 8), 0.16 / 0.48 ms against 0.86 /
1.3 ms (GPT-OSS-20B EP 4 / 8), and 5 ms against 161 ms on a synthetic skewed batch at G = 64;
HiGHS's simplex through `scipy.optimize.linprog` took 220-250 ms on one aggregated DeepSeek EP 8
batch (the LP is highly degenerate). Items of one type take their devices in item order, lowest
device first (which of several optima is returned does not change the objective).
"""

from __future__ import annotations

import numpy as np


def row_types(hits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(types int64[R, G] the distinct rows of hits int[n, G] >= 0, inverse int64[n]: item i's
    type)."""
    h = np.asarray(hits, np.int64)
    if h.shape[0] == 0:
        return h.reshape(0, h.shape[1]), np.zeros(0, np.int64)
    base = int(h.max()) + 1
    if base ** h.shape[1] < 2 ** 62:                 # one int64 key a row: np.unique on 1-D
        key = h @ (base ** np.arange(h.shape[1], dtype=np.int64))
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        return h[first], inv.reshape(-1)
    types, inv = np.unique(h, axis=0, return_inverse=True)
    return types, inv.reshape(-1)


def transport_counts(types: np.ndarray, count: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """int64[R, G]: x[r, g] items of type r on device g maximising sum x * types, every type's
    count int[R] placed, device g holding at most caps int[G] (exactly, when sum caps = sum
    count). types int[R, G] >= 0.

    A min-cost flow: node r (supply count[r]) -> device node g (arc of capacity count[r], unit
    cost max(types) - types[r, g], so the cheapest flow keeps the most hits) -> a sink (arc of
    capacity caps[g], cost 0; demand sum count)."""
    types = np.asarray(types, np.int64)
    count = np.asarray(count, np.int64)
    caps = np.asarray(caps, np.int64)
    R, G = types.shape
    n = int(count.sum())
    if int(caps.sum()) < n:
        raise ValueError(f"caps hold {int(caps.sum())} items, {n} to place")
    if R == 0 or n == 0:
        return np.zeros((R, G), np.int64)
    # imported here: the extension takes about 0.1 s to load, which no other command should pay
    from ortools.graph.python import min_cost_flow

    flow = min_cost_flow.SimpleMinCostFlow()
    sink = R + G
    top = int(types.max())
    flow.add_arcs_with_capacity_and_unit_cost(
        np.repeat(np.arange(R), G), R + np.tile(np.arange(G), R), np.repeat(count, G),
        (top - types).ravel())
    flow.add_arcs_with_capacity_and_unit_cost(
        R + np.arange(G), np.full(G, sink), caps, np.zeros(G, np.int64))
    flow.set_nodes_supplies(np.arange(R + G + 1),
                            np.concatenate([count, np.zeros(G, np.int64), [-n]]))
    status = flow.solve()
    if status != flow.OPTIMAL:                          # cannot happen when caps hold n items
        raise RuntimeError(f"min-cost flow: status {status}")
    return np.asarray(flow.flows(np.arange(R * G)), np.int64).reshape(R, G)


def optimal_assign(hits: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """int64[n]: each item's device maximising the total hits int[n, G] >= 0 under caps int[G]
    (sum >= n; device g takes at most caps[g] items, exactly when sum caps = n)."""
    types, inv = row_types(hits)
    count = np.bincount(inv, minlength=types.shape[0])
    x = transport_counts(types, count, np.asarray(caps))
    G = types.shape[1]
    # items sorted by type (stable: item order within a type) take the devices of x row by row
    order = np.argsort(inv, kind="stable")
    out = np.empty(inv.size, np.int64)
    out[order] = np.repeat(np.tile(np.arange(G), types.shape[0]), x.ravel())
    return out
