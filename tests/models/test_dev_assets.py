"""The committed assets: tokenizer, the three tiny models and the dev traces recorded from them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from sempar.paths import DEV_TRACES, assets_dir, dev_trace_paths
from sempar.trace import read_trace

MODELS = assets_dir() / "models"
needs_models = pytest.mark.skipif(not all((MODELS / n / "model.safetensors").is_file()
                                          for n in DEV_TRACES), reason="tiny models not built")


def test_tokenizer_committed():
    from sempar.tiny.tokenizer import load_tokenizer

    tok = load_tokenizer()
    assert tok.get_vocab_size() == 8192
    ids = tok.encode("def main():\n    print('Guten Tag, мир')").ids
    assert tok.decode(ids) == "def main():\n    print('Guten Tag, мир')"


@needs_models
def test_model_sizes_within_budget():
    """Every committed model counts: 64 MiB for the three (docs/corpus-models.md, "three tiny MoE models")."""
    weights = sorted(MODELS.glob("*/model.safetensors"))
    assert {w.parent.name for w in weights} >= set(DEV_TRACES)
    total = sum(w.stat().st_size for w in weights)
    assert total <= 64 * 2**20, f"committed models take {total / 2**20:.1f} MiB"
    for n in DEV_TRACES:
        info = json.loads((MODELS / n / "train.json").read_text())
        assert info["heldout_lm_loss"] < 7.0  # far below ln(8192) = 9.0 of an untrained model


@needs_models
@pytest.mark.parametrize("name", DEV_TRACES)
def test_record_named_model_twice_same_bytes(name, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("import os\nprint(os.getcwd())\n\nThe king is dead; long live the king.\n")
    outs = []
    for i in range(2):
        out = tmp_path / f"{i}.parquet"
        r = subprocess.run([sys.executable, "-m", "sempar.cli", "record", "--model", name,
                            "--text", f"{text}:mixed", "--out", str(out)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    r = subprocess.run([sys.executable, "-m", "sempar.cli", "trace", "validate",
                        str(tmp_path / "0.parquet")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    t = read_trace(tmp_path / "0.parquet")
    assert t.num_requests == 2 and t.domains == ["mixed"] and t.meta.num_layers == 6


@pytest.mark.skipif(len(dev_trace_paths()) < 2, reason="dev traces not recorded")
def test_dev_traces_cover_every_domain():
    total = 0
    for path in dev_trace_paths():
        total += path.stat().st_size
        t = read_trace(path)
        counts = t.domain_counts()
        assert set(counts) == {"code", "docs", "literature", "math", "chat", "de-ru"}
        assert min(counts.values()) >= 40_000
        # every request stays inside one domain
        first = np.unique(t.request_id, return_index=True)[1]
        assert np.array_equal(t.domain[first][np.searchsorted(np.unique(t.request_id), t.request_id)],
                              t.domain)
    assert total <= 30 * 2**20


H8 = MODELS / "tiny-moe64-h8"


@pytest.mark.skipif(not (H8 / "model.safetensors").is_file(), reason="tiny-moe64-h8 not built")
def test_h8_model_trained_and_traced():
    """The 8-head variant (TP at G = 8) is a trained checkpoint with its own trace, and every
    committed dev trace together stays within the dev traces' 30 MB budget (the shipped
    real-model traces have their own, 12.5 MB: assets/traces/NOTICE)."""
    info = json.loads((H8 / "train.json").read_text())
    assert info["heldout_lm_loss"] < 7.0
    assert json.loads((H8 / "config.json").read_text())["num_attention_heads"] == 8
    trace = assets_dir() / "traces" / "tiny-moe64-h8.parquet"
    t = read_trace(trace)
    assert t.meta.num_layers == 6 and t.meta.num_experts == 64
    assert set(t.domain_counts()) == {"code", "docs", "literature", "math", "chat", "de-ru"}
    total = sum(p.stat().st_size for p in dev_trace_paths())
    assert total <= 30 * 2**20
    from sempar.paths import REAL_TRACES, real_trace_path

    real = sum(real_trace_path(name).stat().st_size for name in REAL_TRACES)
    assert real <= 12.5 * 2**20


def test_real_data_env_is_the_only_place_looked_at_when_set(tmp_path, monkeypatch):
    """$SEMPAR_REAL_DATA, when set, decides alone: a folder that does not exist means no real
    data even with shared/ beside the checkout (how CI and a worktree see a user's machine)."""
    from sempar.paths import ENV, real_data_dir

    (tmp_path / "shared" / "data" / "real").mkdir(parents=True)
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")             # ../shared/data/real beside the cwd
    monkeypatch.delenv(ENV, raising=False)
    assert real_data_dir() is not None
    monkeypatch.setenv(ENV, str(tmp_path / "nowhere"))
    assert real_data_dir() is None
    monkeypatch.setenv(ENV, str(tmp_path / "shared" / "data" / "real"))
    assert real_data_dir() == tmp_path / "shared" / "data" / "real"
