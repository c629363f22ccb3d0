"""serve-sim's expert loads follow the placement's dispatch rule (issue 45; steptable.py
`expert_loads`): per simulated step, a balancing rule lowers the most loaded device."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_bytes_follow_the_dispatch():
    """serve-sim counts the all-to-all bytes after the placement's dispatch rule (issue 45):
    the simulation's local share is the dispatch's, and a rule that sends activations away
    from home moves more bytes than the nearest copy."""
    from sempar.comm.pipelines import PIPELINES
    from sempar.comm.simulate import SimOptions
    from sempar.serving.steptable import dispatched, sample_steps

    topo = TOPOLOGIES.get("pcie-upi8")(None)
    G, N, n = topo.num_devices, 16, 128
    phy = np.concatenate([np.r_[np.arange(d, N, G), (d + 1) % G] for d in range(G)])[None]
    rng = np.random.default_rng(1)
    pr = np.r_[[4.0, 4.0], np.ones(N - 2)]
    ex = np.stack([rng.choice(N, 2, replace=False, p=pr / pr.sum())
                   for _ in range(4 * n)])[:, None, :].astype(np.int32)
    home = rng.integers(0, G, (4 * n, 1)).astype(np.int32)
    pipe, opts = PIPELINES.get("ds-moe"), SimOptions(hidden=64)
    got = {}
    for rule in ("nearest", "lp"):
        p = Placement(phy, N, G).validate()
        p.info["dispatch"] = rule
        s = sample_steps(ex, home, p, topo, pipe, opts, n, sample_tokens=4 * n, top_only=True)
        got[rule] = s
        served = dispatched(ex[:4 * n], home[:4 * n], p, n, True)
        assert (served is None) == (rule == "nearest")
    # lp moves home-hosted activations of the replicated experts away to balance: less local
    assert got["lp"].lar < got["nearest"].lar
    from dataclasses import replace

    from sempar.comm.simulate import simulate
    p = Placement(phy, N, G).validate()
    p.info["dispatch"] = "lp"
    served = dispatched(ex, home, p, n, True)
    o = replace(opts, batch=n)
    after, before = simulate(ex, home, p, topo, pipe, o, served), simulate(ex, home, p, topo,
                                                                             pipe, o)
    local = float((served[:, 0] == home).mean())
    assert after["total"]["lar_mean"] == pytest.approx(local)
    assert before["total"]["lar_mean"] > local
    assert after["total"]["bytes_by_phase"]["dispatch"] > \
        before["total"]["bytes_by_phase"]["dispatch"]
