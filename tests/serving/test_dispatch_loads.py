"""serve-sim's expert loads follow the placement's dispatch rule (issue 45; steptable.py
`expert_loads`): per simulated step, a balancing rule lowers the most loaded device."""

from __future__ import annotations

import numpy as np

from sempar.comm.topology_presets import TOPOLOGIES
from sempar.placement.placement import Placement
from sempar.serving.steptable import expert_loads


def test_per_step_loads_after_dispatch():
    topo = TOPOLOGIES.get("pcie-upi8")(None)
    G, N, S, n = topo.num_devices, 16, 8, 256
    # device d: experts d and d + 8, plus a copy of expert (d + 1) % G
    phy = np.concatenate([np.r_[np.arange(d, N, G), (d + 1) % G] for d in range(G)])[None]
    p = Placement(phy, N, G).validate()
    rng = np.random.default_rng(0)
    pr = np.r_[[3.0, 3.0], np.ones(N - 2)]
    ex = np.stack([rng.choice(N, 2, replace=False, p=pr / pr.sum())
                   for _ in range(S * n)])[:, None, :]
    home = rng.integers(0, G, (S * n, 1))
    peak = {}
    for rule in (None, "locality-first", "lp"):
        if rule is not None:
            p.info["dispatch"] = rule
        copies, _ = expert_loads(ex, home, p, topo, 4096.0, S, n, True)
        assert copies.sum() == S * n * 2                     # every activation served once
        peak[rule] = float((copies.max(axis=2) / copies.mean(axis=2)).mean())
    assert peak["lp"] <= peak["locality-first"] < peak[None]
