"""`drift --order groups` on a trace whose domains are not MMLU subjects is one line and exit 2
(it used to be --order tasks, silently)."""

from __future__ import annotations

from pathlib import Path

import sempar
from hostile import refused

ESFT = Path(sempar.__file__).parent / "assets" / "traces" / "deepseek-v2-lite-esft.parquet"


def test_drift_groups_on_domains_that_are_not_mmlu_subjects_is_refused(tmp_path):
    out = tmp_path / "s.parquet"
    refused(["drift", "--trace", ESFT, "--order", "groups", "--out", out], tmp_path,
            "not MMLU subjects", out)
