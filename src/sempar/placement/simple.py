"""The placements engines use without any profile: contiguous (`vanilla`) and `round-robin`.

Neither places replicas by load: with `redundant` > 0 the extra slots repeat experts 0, 1, ...
in order (on devices that do not hold them yet), which is what a fixed replica layout gives.
"""

from __future__ import annotations

import numpy as np

from sempar.placement.base import SOLVERS, PlacementProblem
from sempar.placement.placement import Placement


def _with_fixed_replicas(order: np.ndarray, p: PlacementProblem) -> np.ndarray:
    """int32[G * S]: `order` (a permutation of the N experts, laid out device-major) padded
    with replicas of experts 0, 1, ... on the devices that lack them."""
    N, G, S = p.trace.meta.num_experts, p.num_devices, p.slots_per_device
    base = N // G
    slots = [list(order[g * base:(g + 1) * base]) for g in range(G)]
    extra = iter(np.tile(np.arange(N), 2 + p.redundant // max(N, 1)))
    for g in range(G):
        while len(slots[g]) < S:
            e = next(extra)
            if e not in slots[g]:
                slots[g].append(int(e))
    return np.concatenate([np.asarray(s, np.int32) for s in slots])


@SOLVERS.register("vanilla", replicas=True, preserves_groups=True, mode_aware=False)
def vanilla(p: PlacementProblem) -> Placement:
    """Device g hosts experts [g * N/G, (g + 1) * N/G): the default EP split of every engine."""
    N, L = p.trace.meta.num_experts, p.trace.meta.num_layers
    row = _with_fixed_replicas(np.arange(N), p)
    return Placement(np.tile(row, (L, 1)), N, p.num_devices, p.node_of(), "vanilla")


@SOLVERS.register("round-robin", replicas=True, preserves_groups=False, mode_aware=False)
def round_robin(p: PlacementProblem) -> Placement:
    """Expert e on device e mod G."""
    N, L, G = p.trace.meta.num_experts, p.trace.meta.num_layers, p.num_devices
    order = np.concatenate([np.arange(g, N, G) for g in range(G)])
    row = _with_fixed_replicas(order, p)
    return Placement(np.tile(row, (L, 1)), N, G, p.node_of(), "round-robin")
