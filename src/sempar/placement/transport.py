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
optimum; `transport_counts` finds one by successive shortest paths on the G-device exchange
graph (min-cost flow, Ahuja, Magnanti & Orlin, "Network Flows", §9.7), in integers throughout.
Measured (DeepSeek-V2-Lite, EP 8, a 2,048-token batch of 367 row types, `vanilla` placement):
13 augmentations, about 2 ms, where HiGHS's simplex through `scipy.optimize.linprog` took
220-250 ms on the same aggregated LP (the problem is highly degenerate) to the same optimum.
Items of one type take their devices in item order, lowest device first (which of several
optima is returned does not change the objective). Cost grows with G: the exchange graph keeps
int64[R, G, G] (R <= n types), and synthetic skewed batches of 2,048 rows with k = 8 took 0.4 s
at G = 16 and 11 s at G = 64 (2026-12-07, load about 10), so the rule is for the EP 4-16
figures; the greedy stays the rule at scale.
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


_BIG = np.int64(1) << 40        # "no edge" in the device exchange graph (costs are small ints)


class _ExchangeGraph:
    """The device exchange graph of an assignment x int64[R, G]: cost[g, g'] int64 the fewest
    hits lost by moving one item from device g to g' (types[r, g] - types[r, g'] over the types
    r with x[r, g] > 0; _BIG where g holds none, and on the diagonal), via[g, g'] that r.
    Rows are refreshed only for the devices whose items changed."""

    def __init__(self, types: np.ndarray, x: np.ndarray):
        self.diff = types[:, :, None] - types[:, None, :]            # [R, G, G]
        self.masked = np.where(x[:, :, None] > 0, self.diff, _BIG)
        self.via = self.masked.argmin(axis=0)
        self.cost = np.take_along_axis(self.masked, self.via[None], axis=0)[0]
        np.fill_diagonal(self.cost, _BIG)

    def update(self, x: np.ndarray, changed: list[tuple[int, int]]) -> None:
        """Refresh after x[r, g] changed for each (r, g) in `changed`."""
        for r, g in changed:
            self.masked[r, g] = self.diff[r, g] if x[r, g] > 0 else _BIG
        for g in {g for _, g in changed}:
            col = self.masked[:, g, :]                                 # [R, G]
            self.via[g] = col.argmin(axis=0)
            self.cost[g] = col[self.via[g], np.arange(col.shape[1])]
            self.cost[g, g] = _BIG


def _shortest_path(cost: np.ndarray, src: np.ndarray, dst: np.ndarray) -> list[int]:
    """Devices of a shortest path (Bellman-Ford, vectorised over edges) from any device in src
    bool[G] to the nearest device in dst bool[G]; the graph has no negative cycle."""
    G = cost.shape[0]
    dist = np.where(src, 0, _BIG)
    pred = np.full(G, -1, np.int64)
    for _ in range(G):
        cand = dist[:, None] + cost                                  # [from, to]
        frm = cand.argmin(axis=0)
        best = cand[frm, np.arange(G)]
        upd = best < dist
        if not upd.any():
            break
        dist[upd], pred[upd] = best[upd], frm[upd]
    t = int(np.flatnonzero(dst)[np.argmin(dist[dst])])
    path = [t]
    while pred[path[-1]] >= 0:
        path.append(int(pred[path[-1]]))
    return path[::-1]


def transport_counts(types: np.ndarray, count: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """int64[R, G]: x[r, g] items of type r on device g maximising sum x * types, every type's
    count int[R] placed, device g holding at most caps int[G] (exactly, when sum caps = sum
    count). types int[R, G] >= 0.

    Successive shortest paths on the device exchange graph: start from every type on its best
    device (optimal without caps, so no negative cycle), then while a device holds more than
    its cap move items along a cheapest chain of moves to a device with room, as many as the
    chain carries at that cost (every type tied at an edge's cost counts). Each step keeps the
    assignment optimal for its loads (the successive-shortest-path invariant of min-cost flow,
    Ahuja-Magnanti-Orlin §9.7), so the last one, within the caps, is optimal."""
    types = np.asarray(types, np.int64)
    count = np.asarray(count, np.int64)
    caps = np.asarray(caps, np.int64)
    R, G = types.shape
    if int(caps.sum()) < int(count.sum()):
        raise ValueError(f"caps hold {int(caps.sum())} items, {int(count.sum())} to place")
    x = np.zeros((R, G), np.int64)
    x[np.arange(R), types.argmax(axis=1) if R else []] = count
    load = x.sum(axis=0)
    graph = _ExchangeGraph(types, x) if (load > caps).any() else None
    while (load > caps).any():
        path = _shortest_path(graph.cost, load > caps, load < caps)
        # each move g -> h may use every type tied at its cheapest cost: units along the path
        # at the same cost are each a shortest augmentation (costs never fall between them)
        moves = [(g, h, np.flatnonzero(graph.masked[:, g, h] == graph.cost[g, h]))
                 for g, h in zip(path, path[1:])]
        amount = min([int(load[path[0]] - caps[path[0]]), int(caps[path[-1]] - load[path[-1]])]
                     + [int(x[rs, g].sum()) for g, _, rs in moves])
        changed = []
        for g, h, rs in moves:
            have = x[rs, g]
            take = np.minimum(have, np.maximum(amount - (np.cumsum(have) - have), 0))
            x[rs, g] -= take
            x[rs, h] += take
            changed += [(int(r), g) for r in rs[take > 0]] + [(int(r), h) for r in rs[take > 0]]
        load[path[0]] -= amount
        load[path[-1]] += amount
        graph.update(x, changed)
    return x


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
