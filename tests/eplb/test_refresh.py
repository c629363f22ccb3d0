"""Refreshing FILE while serving (docs/eplb-plugin.md): per-shard statistics merged over a
rolling window by the CLI into FILE, written atomically over the previous version; the
plug-in's loader picks the new version up at the next rebalance."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from eplb_cases import G
from sempar.eplb.source import load_source


def _cli(*args):
    r = subprocess.run([sys.executable, "-m", "sempar.cli", *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.slow       # five CLI runs
def test_rolling_window_refresh(tiny_trace, tmp_path):
    from sempar.trace.io import write_trace

    tr = tiny_trace
    req = np.unique(tr.request_id)
    shards = []
    for i, part in enumerate(np.array_split(req, 3)):
        p = tmp_path / f"routing-{i}.parquet"
        write_trace(tr.take(np.isin(tr.request_id, part)), p)
        _cli("stats", "build", "--trace", p, "--parts", "sample,coactivation",
             "--out", tmp_path / f"routing-{i}.stats")
        shards.append(tmp_path / f"routing-{i}.stats")
    live = tmp_path / "eplb.stats"
    L, N = tr.meta.num_layers, tr.meta.num_experts

    def window(paths):
        _cli("stats", "merge", *[a for s in paths for a in ("--stats", s)], "--out", live)
        return load_source(str(live), num_layers=L, num_experts=N, num_ranks=G, settle_s=0)

    a = window(shards[:2])
    b = window(shards[1:])                                   # the window rolled on
    assert b is not a
    from sempar.affinity.summary_file import load_stats

    want = sum(load_stats(s).coactivation for s in shards[1:]).astype(np.float32)
    idx = np.arange(N)
    want[:, idx, idx] = 0
    assert np.array_equal(b.affinity, want)
    assert not np.array_equal(a.affinity, b.affinity)
