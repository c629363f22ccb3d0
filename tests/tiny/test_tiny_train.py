"""`train-tiny` on a small hand-made corpus: a real (very short) training run of each model."""

from __future__ import annotations

import json

import pytest

from sempar.corpus.fetch import DOC_MARKER, MANIFEST, sha256_file
from sempar.tiny.models import TINY_MODELS


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    texts = {"code": "def f(x):\n    return x + {i}\n", "prose": "The {i}th day was long and warm.",
             "de-ru": "Guten Morgen {i}! Доброе утро {i}."}
    files = {}
    for domain, tmpl in texts.items():
        path = folder / f"{domain}.txt"
        path.write_text("".join(tmpl.format(i=i) * 5 + f"\n{DOC_MARKER}\n" for i in range(60)))
        files[path.name] = {"domain": domain, "sha256": sha256_file(path),
                            "bytes": path.stat().st_size, "documents": 60}
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "sources": {}, "files": files}))
    return folder


@pytest.mark.parametrize("name", TINY_MODELS.names())
def test_train_tiny_runs_and_saves(name, corpus, tmp_path, monkeypatch):
    import sempar.tiny.data as data
    from sempar.tiny.train import train_tiny

    monkeypatch.setattr(data, "HELDOUT_TOKENS", 300)
    out = tmp_path / name
    info = train_tiny(name, corpus, out, minutes=5, max_steps=3, batch_size=2, seq_len=32)
    assert info["steps"] == 3 and info["tokens_seen"] == 3 * 2 * 32
    assert info["loss_last50"] > 0 and info["heldout_lm_loss"] > 0
    assert set(info["train_tokens_per_domain"]) == {"code", "prose", "de-ru"}
    for f in ("model.safetensors", "config.json", "loss.png", "train.json", "tokenizer.json"):
        assert (out / f).stat().st_size > 0, f
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["output_router_logits"] is True and cfg["router_aux_loss_coef"] == 0.01
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
