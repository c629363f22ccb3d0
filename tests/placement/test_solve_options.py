"""SolveOptions: the user's solve options as one frozen object, and the objective that follows
the deployment's home rule (`--homes`, `SolveOptions.items`), recorded in the placement."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import build_trace, run_cli
from sempar.errors import InputError
from sempar.placement import PlacementProblem, solve
from sempar.solve_options import DEFAULT_HOMES, HOME_RULES, SolveOptions
from sempar.trace import write_trace
from sempar.trace.ops import without_token_ids


def test_options_are_frozen_keyword_only_and_checked() -> None:
    o = SolveOptions(mode="dp", redundant=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.mode = "tp"  # type: ignore[misc]
    with pytest.raises(TypeError):
        SolveOptions("dp")  # type: ignore[misc]
    for bad in ({"mode": "ep"}, {"objective": "words"}, {"homes": "nowhere"},
                {"max_imbalance": 0.9}, {"held_out_imbalance": 0.5}, {"jobs": 0},
                {"redundant": -1}):
        with pytest.raises(InputError):
            SolveOptions(**bad)
    # a problem is the options plus the trace and devices, and gives them back whole
    p = PlacementProblem.of(build_trace(), 4, o)
    assert (p.mode, p.redundant, p.num_devices) == ("dp", 4, 4) and p.solve_options() == o


def test_auto_objective_follows_the_home_rule() -> None:
    assert set(HOME_RULES.names()) == {"positions", "exact", "table"}
    assert DEFAULT_HOMES == "positions"                 # sglang-ep's, the plan's usual answer
    assert SolveOptions(homes=DEFAULT_HOMES).items(True) == "rows"
    assert SolveOptions().homes is None and SolveOptions().items(True) == "tokens"  # not said
    assert SolveOptions().items(False) == "rows"
    assert SolveOptions(homes="exact").items(True) == "rows"
    assert SolveOptions(homes="table").items(True) == "tokens"
    assert SolveOptions(homes="table").items(False) == "rows"     # no ids: rows whatever
    assert SolveOptions(homes="table", objective="rows").items(True) == "rows"  # named wins


def test_placement_records_home_rule_and_objective() -> None:
    t = build_trace()
    p = solve("sempar", t, num_devices=4, homes="positions")
    assert (p.info["homes"], p.info["objective"]) == ("positions", "rows")
    p = solve("sempar", t, num_devices=4)                # no rule named: nothing recorded
    assert "homes" not in p.info and p.info["objective"] == "tokens"
    p = solve("sempar", t, num_devices=4, options=SolveOptions(homes="table"))
    assert (p.info["homes"], p.info["objective"]) == ("table", "tokens")
    p = solve("sempar", without_token_ids(t), num_devices=4, homes="table")
    assert p.info["objective"] == "rows" and p.token_table is None
    with pytest.raises(InputError, match="--objective tokens needs token ids"):
        solve("sempar", without_token_ids(t), num_devices=4, objective="tokens")


def test_place_cli_takes_homes(tmp_path) -> None:
    """The command line's default is the plan's usual deployment (position homes: rows); the
    placement JSON records the rule and the objective."""
    write_trace(build_trace(), tmp_path / "t.parquet")
    for extra, want in (((), ("positions", "rows")), (("--homes", "table"), ("table", "tokens"))):
        r = run_cli("place", "--trace", "t.parquet", "--ep", "4", *extra, "--out", "p.json",
                    cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        info = json.loads((tmp_path / "p.json").read_text())["info"]
        assert (info["homes"], info["objective"]) == want
    r = run_cli("place", "--trace", "t.parquet", "--ep", "4", "--homes", "nowhere",
                "--out", "q.json", cwd=tmp_path)
    assert r.returncode == 2 and "nowhere" in r.stderr and not (tmp_path / "q.json").exists()


def test_forecast_solves_each_deployment_for_its_homes() -> None:
    from sempar.comm.pipelines import PIPELINES
    from sempar.serving.forecast import home_rule
    from sempar.serving.systems import Variant

    def rule(pipeline, policy="round-robin", schedule="none"):
        return home_rule(PIPELINES.get(pipeline), Variant("sempar", pipeline, policy, schedule))

    assert rule("sglang-ep") == "positions" and rule("ds-moe") == "positions"
    assert rule("sglang-ep", "alg2", "online") == "table"
    assert rule("smoe", "alg2", "online") == "table"
    assert rule("smoe-exact", "alg2", "online") == "exact"
