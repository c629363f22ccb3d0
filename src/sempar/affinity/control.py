"""Random-router control: the same tokens and requests routed uniformly at random.

A trained router is only "specialised" if its statistics beat those of a router that ignores
the token: each (token, layer) draws k distinct experts uniformly (and, for group-limited models,
`topk_groups` groups first). Figures of the control set the floor for F1, kurtosis, look-back
accuracy and inter-layer affinity.
"""

from __future__ import annotations

import numpy as np

from sempar.trace.schema import RoutingTrace


def random_router_like(trace: RoutingTrace, seed: int = 0) -> RoutingTrace:
    """A copy of `trace` whose experts int[T, L, k] are drawn uniformly at random."""
    rng = np.random.default_rng(seed)
    T, L, k = trace.experts.shape
    m = trace.meta
    if m.topk_groups < m.num_expert_groups:
        per_group = m.num_experts // m.num_expert_groups
        groups = np.argsort(rng.random((T, L, m.num_expert_groups)), axis=2)[:, :, :m.topk_groups]
        members = np.argsort(rng.random((T, L, m.topk_groups * per_group)), axis=2)[:, :, :k]
        experts = (np.take_along_axis(groups, members // per_group, axis=2) * per_group
                   + members % per_group)
    else:
        experts = np.argsort(rng.random((T, L, m.num_experts), dtype=np.float32), axis=2)[:, :, :k]
    out = trace.take(np.arange(T))
    out.experts = experts.astype(trace.experts.dtype)
    out.weights = None
    return out
