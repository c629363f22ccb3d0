"""Two outputs of one run never name the same path (or one inside the other): every verb with
more than one output (calibrate, replay, profile) refuses with one line before any work, and
writes nothing; replay's refusals name its own options."""

from __future__ import annotations

from pathlib import Path

import pytest

import sempar
from hostile import refused

ESFT = Path(sempar.__file__).parent / "assets" / "traces" / "deepseek-v2-lite-esft.parquet"


@pytest.mark.parametrize("second", ["same", "inside"])
def test_calibrate_profile_and_measurements_collide(tmp_path, second):
    out = tmp_path / "prof.json"
    other = out if second == "same" else tmp_path
    refused(["calibrate", "--device", "cpu", "--out", out, "--measurements-out", other],
            tmp_path, "its own path", out)


@pytest.mark.parametrize("second", ["same", "inside"])
def test_replay_plot_and_placements_collide(tmp_path, second):
    plot = tmp_path / "d"
    steps = plot if second == "same" else plot / "steps"
    line = refused(["replay", "--trace", ESFT, "--ep", "4", "--max-steps", "1", "--plot", plot,
                    "--placements", steps], tmp_path, "its own path")
    assert "--placements" in line and not plot.exists()


def test_replay_refusals_name_replays_options(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    line = refused(["replay", "--trace", ESFT, "--ep", "4", "--max-steps", "1", "--placements",
                    tmp_path / "mine"], tmp_path, "--placements")
    assert "--out" not in line
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's"


def test_profile_topology_and_plot_collide(tmp_path):
    out = tmp_path / "topo.json"
    refused(["profile", "--ep", "2", "--out", out, "--plot", out], tmp_path, "its own path", out)

