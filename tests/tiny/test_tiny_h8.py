"""tiny-moe64-h8, the 8-head variant of tiny-moe64 (issue 19): its shape, its heads split over
G = 8 ranks, and a G = 8 tensor-parallel forward through the runtime that reproduces the model's
logits (the three TP modes, vanilla placement). The runtime tests use the registered config with
seeded random weights (the runtime's losslessness does not depend on training); the packaged
checkpoint is checked when it is installed."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from sempar.paths import assets_dir
from sempar.placement.placement import Placement
from sempar.runtime import RunSpec, reference_logits, run_many
from sempar.bench import tp_ok
from sempar.tiny.models import TINY_MODELS

MODEL = "tiny-moe64-h8"
TOL = 1e-5


def _model(name: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(TINY_MODELS.get(name).make_config())


@pytest.fixture(scope="module")
def h8_dir(tmp_path_factory):
    """tiny-moe64-h8's config with seeded random weights, saved as a model folder."""
    d = tmp_path_factory.mktemp("h8")
    _model(MODEL).save_pretrained(d)
    shutil.copy(assets_dir() / "tokenizer.json", d / "tokenizer.json")
    return str(d)


def test_config_is_tiny_moe64_with_8_heads():
    m, base = _model(MODEL), _model("tiny-moe64")
    assert type(m).__name__ == "Qwen3MoeForCausalLM"
    c = m.config
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (8, 4, 16)
    assert (c.num_experts, c.num_experts_per_tok, c.hidden_size, c.num_hidden_layers) == \
        (64, 8, 128, 6)
    # The same parameter shapes but for the per-head q/k norms: the heads are cut finer.
    mine = {n: tuple(p.shape) for n, p in m.named_parameters()}
    theirs = {n: tuple(p.shape) for n, p in base.named_parameters()}
    assert mine.keys() == theirs.keys()
    assert {n.split(".")[-2] for n in mine if mine[n] != theirs[n]} == {"q_norm", "k_norm"}


def test_heads_split_over_8_ranks(h8_dir):
    assert tp_ok(h8_dir, 8) and tp_ok(h8_dir, 4) and tp_ok(h8_dir, 2)
    assert not tp_ok("tiny-moe64", 8)


@pytest.mark.slow
def test_tp_forward_g8_lossless(h8_dir):
    G, L, N = 8, 6, 64
    placement = Placement(np.tile(np.arange(N), (L, 1)), N, G, method="vanilla").validate()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 8192, (G, 12), generator=g)
    targets = torch.randint(-1, G, (L, ids.numel()), generator=g)
    specs = [RunSpec(h8_dir, ids, placement, "tp-allreduce"),
             RunSpec(h8_dir, ids, placement, "tp-rebatch", targets=targets),
             RunSpec(h8_dir, ids, placement, "tp-exact")]
    ref = reference_logits(h8_dir, ids)
    for spec, r in zip(specs, run_many(specs, G, deadline=600)):
        assert r.logits.shape == ref.shape
        diff = (r.logits - ref).abs().max().item()
        assert torch.allclose(r.logits, ref, rtol=TOL, atol=TOL), f"{spec.mode}: {diff:.2e}"
        assert r.total("dispatch") > 0, spec.mode


def test_packaged_checkpoint():
    from sempar.models import load_model

    if not (assets_dir() / "models" / MODEL / "config.json").is_file():
        pytest.skip(f"{MODEL} is not trained yet (scripts/make-dev-assets.sh builds it)")
    m = load_model(MODEL)
    assert type(m).__name__ == "Qwen3MoeForCausalLM"
    assert (m.config.num_attention_heads, m.config.num_key_value_heads) == (8, 4)
