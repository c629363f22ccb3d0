"""The one table of real models (`sempar.model_presets`): every reader agrees with it, and the
README's and docs/cli.md's presets lines and the `--preset` helps are generated from it."""

from __future__ import annotations

import re
from pathlib import Path

from sempar.model_presets import MODEL_PRESETS, describe_line, names, names_line

ROOT = Path(__file__).resolve().parents[2]


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_readme_lists_every_preset():
    readme = _flat((ROOT / "README.md").read_text(encoding="utf-8"))
    line = re.search(r"Presets \(`--preset`, `synth`\): (.*?)\.(?: |$)", readme)
    assert line and line.group(1) == names_line()


def test_cli_doc_describes_every_preset():
    doc = _flat((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert f"Presets: {describe_line()}." in doc


def test_readers_take_the_table():
    from sempar.serving.deploy import model_path
    from sempar.serving.dims import model_dims
    from sempar.trace.presets import HIDDEN_SIZES, PRESETS

    assert PRESETS.names() == names() == list(HIDDEN_SIZES)
    for name, p in MODEL_PRESETS.items():
        meta, dims = PRESETS.get(name), model_dims(name)
        assert meta.layer_ids == tuple(range(p.dense_layers, p.layers))
        assert (meta.num_experts, meta.top_k, meta.vocab_size, meta.model_type) == \
            (p.experts, p.top_k, p.vocab, p.family.model_type)
        assert (dims.layers, dims.moe_layers, dims.hidden, dims.vocab) == \
            (p.layers, p.moe_layers, p.hidden, p.vocab) == \
            (meta.num_hidden_layers, meta.num_layers, HIDDEN_SIZES[name], meta.vocab_size)
        assert model_path(name) == p.model_path


def test_preset_helps_list_the_table():
    from typer.testing import CliRunner

    from sempar.cli import app

    for verb in ("synth", "serve-sim", "plan"):
        out = _flat(CliRunner().invoke(app, [verb, "--help"], env={"COLUMNS": "400"}).output)
        assert ", ".join(names()) in out, verb
