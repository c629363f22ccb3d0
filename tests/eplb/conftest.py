"""Fixtures of the engine-balancer plug-in tests: FILEs made from the shipped tiny-moe64 trace
(6 MoE layers x 64 experts, top-8), a stats file and a placement JSON, for EP 4 with 4
redundant slots (P = 68)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

TINY = Path(__file__).resolve().parents[2] / "src" / "sempar" / "assets" / "traces" / "tiny-moe64.parquet"
from eplb_cases import G


@pytest.fixture(scope="session")
def tiny_trace():
    from sempar.trace import read_trace

    tr = read_trace(TINY)
    return tr.take(np.isin(tr.request_id, np.unique(tr.request_id)[:100]))


@pytest.fixture(scope="session")
def files(tiny_trace, tmp_path_factory):
    """{"stats": path, "placement": path, "window": float[L, N] live load of other requests}."""
    from sempar.affinity.summary_build import StatsBuilder
    from sempar.affinity.summary_file import save_stats
    from sempar.eplb.source import partition
    from sempar.placement.placement import Placement
    from sempar.trace import read_trace

    tr = tiny_trace
    d = tmp_path_factory.mktemp("eplb")
    b = StatsBuilder(tr.meta, tr.domains, ("sample", "coactivation"), 0, 2000, "tiny")
    b.add({"token_id": tr.token_id, "request_id": tr.request_id, "position": tr.position,
           "experts": tr.experts, "domain": None if tr.domain is None else tr.domain})
    st = b.finish()
    save_stats(st, d / "tiny.stats")
    L, N = tr.meta.num_layers, tr.meta.num_experts
    phy2log = np.stack([np.argsort(partition(st.coactivation[l].astype(np.float32), G),
                                   kind="stable") for l in range(L)])
    Placement(phy2log, N, G, method="test", info={"model": tr.meta.model}).save(
        d / "tiny.placement.json")
    full = read_trace(TINY)
    later = full.take(np.isin(full.request_id, np.unique(full.request_id)[1000:1200]))
    window = np.stack([np.bincount(later.experts[:, l].ravel(), minlength=N)
                       for l in range(L)]).astype(np.float64)
    return {"stats": d / "tiny.stats", "placement": d / "tiny.placement.json",
            "window": window, "dir": d, "model": tr.meta.model}
