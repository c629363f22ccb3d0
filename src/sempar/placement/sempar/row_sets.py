"""The `rows` objective's tp solve, layer by layer on aggregated rows (the fast path).

With homes from exact pre-routing (rows.py) a fit row's item is the set of experts it selects
at one layer, and nothing in the tp objective tells two rows with the same set apart: both gain
the same local activations on every device and both take one token of their batch's share. So
at each MoE layer the fit rows are collapsed into their distinct expert sets, each set one item
weighing its number of rows (its occurrences in the pseudo-batches of tp mode's capacity,
`tokens.pseudo_batches`), and the layer is solved alone by the `tokens` solve on a one-layer
trace whose token id is the set's index. The `tokens` solve already treats a token id as an
item of that many occurrences (counts c[u, e] and frequencies a[u], `AffinityStats`), so the
row-level objective is unchanged; the only restriction is that the rows of one set share one
device in the token step (the capacity-bound homes the objective is judged by,
`capacity.capacity_home`, still home each row alone).

Distinct sets per layer on real routing (top-6 of 64 on DeepSeek-V2-Lite, 25,028 rows: 8-14k;
top-4 of 32 on GPT-OSS-20B, 152,445 rows: 5-10k), so the token step, METIS's graph and the
counts shrink 2-20x. tp mode's layers are independent, so they are solved on `jobs` forked
workers (`_pool.map_layers`); every layer's result depends on the seed only, not on the workers.

Ours (an implementation of the same objective, not a change of it); the per-row path stays
behind `SemparConfig.row_sets = False` for comparison (benchmarks/bench_rows_speed.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sempar.placement.base import PlacementProblem
from sempar.placement.placement import Placement
from sempar.trace.schema import RoutingTrace


def set_ids(experts: np.ndarray) -> np.ndarray:
    """int64[T]: the index of each row's expert set among the distinct sets (sorted order),
    experts int[T, k] (the order within a row does not matter)."""
    ex = np.sort(np.asarray(experts, np.int64), axis=1)
    T, k = ex.shape
    base = int(ex.max(initial=0)) + 1
    if base ** k < 2 ** 62:             # one int64 key a row: a 1-D unique (10x the 2-D one)
        key = ex @ (base ** np.arange(k, dtype=np.int64))
        _, inv = np.unique(key, return_inverse=True)
    else:
        _, inv = np.unique(ex, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


def layer_trace(rows: RoutingTrace, l: int) -> RoutingTrace:
    """MoE layer l of `rows` as a one-layer trace whose token id is the row's expert-set index."""
    ids = set_ids(rows.experts[:, l])
    meta = dataclasses.replace(rows.meta, num_layers=1, layer_ids=None, num_hidden_layers=None,
                               vocab_size=max(int(ids.max(initial=0)) + 1, 1), has_token_ids=True)
    return dataclasses.replace(
        rows, meta=meta, token_id=ids, experts=rows.experts[:, l:l + 1],
        weights=None if rows.weights is None else rows.weights[:, l:l + 1])


@dataclass(frozen=True, eq=False)
class _Layer:
    """One layer's solve (forked workers may call it): solve_one solves a one-layer problem."""

    p: PlacementProblem
    solve_one: Callable[[PlacementProblem], Placement]

    def __call__(self, l: int) -> tuple[np.ndarray, float, int]:
        """(phy2log int[G * S] of layer l, its fit local activations, distinct sets)."""
        lt = layer_trace(self.p.trace, l)
        out = self.solve_one(dataclasses.replace(self.p, trace=lt, jobs=1))
        return out.phy2log[0], float(out.info["fit_local_activations"][0]), lt.meta.vocab_size


def solve_by_layer(p: PlacementProblem, solve_one: Callable[[PlacementProblem], Placement],
                   mapper: Callable, jobs: int) -> Placement:
    """The tp placement of the row trace p.trace (rows.row_trace), each layer solved alone by
    `solve_one` (the `tokens` solve) on its aggregated rows, on up to `jobs` workers by `mapper`
    (`_pool.map_layers`' signature). info as the `tokens` solve's, plus "row_sets": the distinct
    sets per layer."""
    L = p.trace.meta.num_layers
    res = mapper(_Layer(p, solve_one), L, max(1, jobs), 1)
    info = {"mode": "tp", "objective": "tokens", "max_imbalance": p.max_imbalance,
            "fit_local_activations": [r[1] for r in res], "preserve_groups": p.preserve_groups,
            "large_trace_path": False, "row_sets": [r[2] for r in res]}
    return Placement(np.stack([r[0] for r in res]), p.trace.meta.num_experts, p.num_devices,
                     p.node_of(), "sempar", info=info)
