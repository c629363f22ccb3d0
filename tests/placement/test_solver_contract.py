"""Every registered placement solver against one contract (tests/solver_contract.py), the check
itself against a solver that breaks it, and `eplb` against DeepSeek EPLB's README example."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import build_trace
from solver_contract import contract_violations
from sempar.errors import InputError
from sempar.placement import SOLVERS, solve
from sempar.placement.base import PlacementProblem, SolverRegistry
from sempar.placement.eplb import rebalance_experts
from sempar.placement.placement import Placement


@pytest.fixture(scope="module")
def traces():
    """(plain, grouped): 200 tokens, 3 layers, 8 experts, top-2; grouped: 2 groups of 4."""
    return build_trace(), build_trace(groups=(2, 1), seed=1)


@pytest.mark.parametrize("name", SOLVERS.names())
def test_registered_solver_keeps_the_contract(name, traces):
    assert contract_violations(name, SOLVERS, *traces) == []


def _toy_registry(**caps) -> tuple[SolverRegistry, list]:
    """A registry holding `toy`: vanilla's split that ignores `redundant`; calls logs each run."""
    calls: list = []
    toy = SolverRegistry("toy method")

    @toy.register("toy", **caps)
    def _toy(p: PlacementProblem) -> Placement:
        calls.append(p)
        N, L = p.trace.meta.num_experts, p.trace.meta.num_layers
        return Placement(np.tile(np.arange(N), (L, 1)), N, p.num_devices, p.node_of(), "toy")

    return toy, calls


def test_contract_catches_a_solver_that_ignores_declared_replicas(traces):
    toy, _ = _toy_registry(replicas=True, preserves_groups=True, mode_aware=False)
    bad = contract_violations("toy", toy, *traces)
    assert len(bad) == 1 and bad[0].startswith("replicas: redundant=4 gave phy2log (3, 8)")
    honest, _ = _toy_registry(replicas=False, preserves_groups=True, mode_aware=False)
    assert contract_violations("toy", honest, *traces) == []


def test_undeclared_capabilities_refused_in_one_line_before_the_solver_runs(traces):
    plain, grouped = traces
    toy, calls = _toy_registry(replicas=False, preserves_groups=False, mode_aware=False,
                               modes=("tp",))
    for t, kw, msg in ((plain, {"redundant": 4}, "--redundant 4: toy places every expert once"),
                       (grouped, {"preserve_groups": True}, "toy: --preserve-groups is not"),
                       (plain, {"mode": "dp"}, "--mode dp: toy serves only tp")):
        with pytest.raises(InputError) as err:
            solve("toy", t, num_devices=4, registry=toy, **kw)
        assert str(err.value).startswith(msg) and "\n" not in str(err.value)
    assert calls == []
    solve("toy", plain, num_devices=4, registry=toy)
    assert len(calls) == 1


def test_solve_takes_the_problem_by_keyword(traces):
    with pytest.raises(TypeError):
        solve("vanilla", traces[0], 4)          # type: ignore[misc]


# DeepSeek EPLB's README example (github.com/deepseek-ai/EPLB, README "Example"; vLLM pins the
# same figures in tests/distributed/test_eplb_algo.py): 2 layers x 12 experts, 16 physical
# experts, 4 expert groups, 2 nodes, 8 GPUs, hierarchical policy, and the phy2log it prints.
README_WEIGHT = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                 [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
README_PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                  [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


def test_eplb_reproduces_deepseek_readme_example():
    phy2log, log2phy, logcnt = rebalance_experts(np.array(README_WEIGHT), num_replicas=16,
                                                 num_groups=4, num_nodes=2, num_gpus=8)
    assert phy2log.tolist() == README_PHY2LOG
    want = np.array(README_PHY2LOG)
    assert logcnt.tolist() == [np.bincount(row, minlength=12).tolist() for row in want]
    for l in range(2):                      # log2phy lists exactly the slots holding each expert
        for e in range(12):
            slots = log2phy[l, e][log2phy[l, e] >= 0]
            assert sorted(slots.tolist()) == np.flatnonzero(want[l] == e).tolist()
