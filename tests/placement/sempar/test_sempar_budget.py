"""The rows objective's work budget (`SemparConfig.budget`, `--effort`): the shipped models keep
the whole sample and every restart, DeepSeek-V3's shape is cut to one restart on a nested
sample, more effort buys rows back, and bad --effort is one line."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.errors import InputError
from sempar.placement import solve
from sempar.placement.sempar.config import SemparConfig
from sempar.solve_options import SolveOptions
from test_sempar_solver import planted


@pytest.mark.parametrize("rows,L,N", [(152_445, 24, 32), (25_028, 26, 64)])
def test_shipped_models_keep_whole_sample_and_restarts(rows, L, N):
    cfg = SemparConfig.for_shape(rows, L, N, 8)
    assert (cfg.budget_rows, cfg.budget_restarts) == (min(rows, cfg.row_sample), cfg.row_restarts)
    full = SemparConfig()                       # the whole held-out calibration runs
    assert (cfg.held_out_retries, cfg.held_out_folds, cfg.held_out_refold) == \
        (full.held_out_retries, full.held_out_folds, full.held_out_refold)


def test_cut_sample_keeps_calibration_within_budget_unless_asked():
    cut = SemparConfig.for_shape(240_000, 58, 256, 16)
    assert (cut.held_out_retries, cut.held_out_folds, cut.held_out_refold) == \
        (0, cut.budget_held_out_folds, False)
    asked = SemparConfig.for_shape(240_000, 58, 256, 16, held_out_retries=3)
    assert asked.held_out_retries == 3 and asked.held_out_folds == cut.budget_held_out_folds
    bought = SemparConfig.for_shape(240_000, 58, 256, 16, effort=1000.0)
    assert bought.held_out_retries == SemparConfig().held_out_retries


def test_large_model_cut_and_effort_buys_back():
    one = SemparConfig.for_shape(240_000, 58, 256, 16)
    assert one.budget_restarts == 1 and one.min_budget_rows <= one.budget_rows < 200_000
    assert one.budget_rows * 58 * 256 <= one.work_budget
    more = SemparConfig.for_shape(240_000, 58, 256, 16, effort=4.0)
    assert more.budget_rows > one.budget_rows
    most = SemparConfig.for_shape(240_000, 58, 256, 16, effort=1000.0)
    assert (most.budget_rows, most.budget_restarts) == (200_000, 3)
    assert not one.hypergraph_start and more.hypergraph_start     # effort 2 on: the second start


def test_effort_reaches_the_solve_and_bad_effort_refused():
    trace, _, _ = planted(T=6000, vocab=300, R=60)
    cfg = SemparConfig(work_budget=6000 * 2 * 16 * 3 - 1)         # just under: 2 restarts
    assert cfg.budget(6000, 2, 16, 1.0) == (6000, 2)
    a = solve("sempar", trace, num_devices=4, objective="rows", effort=1e-4)
    b = solve("sempar", trace, num_devices=4, objective="rows")
    assert a.info["fit_rows"] < b.info["fit_rows"] == 6000
    assert np.array_equal(a.phy2log, solve("sempar", trace, num_devices=4, objective="rows",
                                           effort=1e-4).phy2log)
    with pytest.raises(InputError, match="--effort"):
        SolveOptions(effort=0)
