"""`sempar export --to vllm` prints how released vLLM gets the placement: SEMPAR_EPLB and the
EPLB flags, which vLLM 0.33.0's own `EPLBConfig` accepts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_export_vllm_prints_the_plugin_launch(files, tmp_path):
    out = tmp_path / "map.json"
    r = subprocess.run([sys.executable, "-m", "sempar.cli", "export", "--placement",
                        str(files["placement"]), "--to", "vllm", "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rel = json.loads(r.stdout)["released_vllm"]
    assert rel["env"] == {"SEMPAR_EPLB": str(files["placement"].absolute())}
    flags = rel["flags"]
    assert "--enable-eplb" in flags and "--enable-expert-parallel" in flags
    cfg = json.loads(flags[flags.index("--eplb-config") + 1])
    assert cfg == {"num_redundant_experts": 0}
    plain = subprocess.run([sys.executable, "-m", "sempar.cli", "export", "--placement",
                            str(files["placement"]), "--to", "vllm", "--out", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert "on released vLLM" in plain.stdout and "SEMPAR_EPLB=" in plain.stdout
    try:
        from vllm.config.parallel import EPLBConfig
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"vLLM's EPLBConfig does not import here: {err}")
    assert EPLBConfig(**cfg).policy == "default"
