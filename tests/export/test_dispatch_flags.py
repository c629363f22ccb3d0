"""Export: a placement with replicas carries its dispatch rule to the engine's flags (issue 45,
export/engines.py `dispatch_flags`; SGLang 0.5.23's `--ep-dispatch-algorithm` choices)."""

from __future__ import annotations

import numpy as np

from sempar.export.engines import dispatch_flags
from sempar.placement.placement import Placement


def _replicated(rule: str | None) -> Placement:
    phy = np.array([[0, 1, 2, 3, 2, 0]])                   # 4 experts, 2 devices x 3 slots
    p = Placement(phy, 4, 2).validate()
    if rule is not None:
        p.info["dispatch"] = rule
    return p


def test_sglang_gets_the_rule_s_algorithm():
    assert dispatch_flags(_replicated("sglang-dynamic"), "sglang") == \
        (["--ep-dispatch-algorithm", "dynamic"], None)
    flags, note = dispatch_flags(_replicated("lp"), "sglang")
    assert flags == ["--ep-dispatch-algorithm", "lp"] and "a2a backend" in note
    flags, note = dispatch_flags(_replicated("locality-first"), "sglang")
    assert flags == ["--ep-dispatch-algorithm", "static"] and "no dispatch rule" in note
    flags, note = dispatch_flags(_replicated("nearest"), "sglang")
    assert flags[-1] == "static" and "nearest" in note
    assert dispatch_flags(_replicated(None), "sglang") == ([], None)   # SGLang's own default


def test_vllm_gets_a_note_unless_its_own_hash():
    assert dispatch_flags(_replicated("vllm-hash"), "vllm") == ([], None)
    flags, note = dispatch_flags(_replicated("locality-first"), "vllm")
    assert flags == [] and "token-row hash" in note


def test_sglang_accepts_every_algorithm_we_print():
    """Every --ep-dispatch-algorithm value we print is one SGLang's own field accepts."""
    import ast
    import importlib.util

    import pytest

    from sempar.placement.dispatch import DISPATCH

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    src = open(f"{spec.submodule_search_locations[0]}/srt/arg_groups/fields/exec_.py").read()
    node = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.AnnAssign)
                and getattr(n.target, "id", "") == "ep_dispatch_algorithm")
    accepted = {c.value for c in ast.walk(node.annotation) if isinstance(c, ast.Constant)
                and isinstance(c.value, str)}
    for rule in DISPATCH.names():
        flags, _ = dispatch_flags(_replicated(rule), "sglang")
        assert flags[0] == "--ep-dispatch-algorithm" and flags[1] in accepted, (rule, flags)
