"""`sempar demo`'s balancer stage: the EPLB plug-in against DeepSeek EPLB on the packaged
DeepSeek-V2-Lite routing, run as the demo runs it (slow: two short replays)."""

from pathlib import Path

import pytest

from sempar.demo.stages import DemoContext
from sempar.demo.system import BALANCER_EP, stage_balancer
from sempar.report.html import HtmlReport


@pytest.mark.slow
def test_balancer_stage_plugin_keeps_locality(tmp_path: Path):
    ctx = DemoContext(work=tmp_path, report=HtmlReport("t"))
    out = stage_balancer(ctx)
    assert out["ep"] == BALANCER_EP and set(out["policies"]) == {"R0", f"R{BALANCER_EP}"}
    for pols in out["policies"].values():
        ours, theirs = pols["sempar-engine"], pols["eplb-periodic"]
        # the plug-in keeps FILE's locality where the load-only layout throws it away,
        # and moves fewer experts doing it
        assert ours["lar_mean"] > 1.1 * theirs["lar_mean"]
        assert ours["migrated_experts"] < theirs["migrated_experts"]
        assert not ours["fallbacks"]
    assert (tmp_path / "figures" / "balancer.png").stat().st_size > 0
