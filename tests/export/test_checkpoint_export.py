"""Permuted HF checkpoints of sharded tiny random-init models: lossless, or refused in one line.

Each family's checkpoint is saved in 100 KB shards (hub-style, with model.safetensors.index.json), so
a layer's experts span shard files; the permuted checkpoint is loaded by transformers and its
logits compared with the original's (max |diff| <= 1e-5).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf_tiny import CONFIGS, tiny_checkpoint
from sempar.errors import InputError
from sempar.export.checkpoint import groups_crossed, permute_checkpoint
from sempar.placement import Placement

torch = pytest.importorskip("torch")

MOE_LAYERS = {"mixtral": [0, 1], "qwen3_moe": [0, 1], "deepseek_v3": [2, 3, 4], "gpt_oss": [0, 1]}


def num_experts(model_type: str) -> int:
    kw = CONFIGS[model_type][1]
    return kw.get("num_local_experts") or kw.get("num_experts") or kw["n_routed_experts"]


def group_preserving(N: int, groups: int, layers: int, seed: int) -> np.ndarray:
    """int[layers, N]: a random permutation within each group of N / groups consecutive ids."""
    rng = np.random.default_rng(seed)
    size = N // groups
    return np.stack([np.concatenate([g * size + rng.permutation(size) for g in range(groups)])
                     for _ in range(layers)])


def placement_for(model_type: str, phy: np.ndarray) -> Placement:
    p = Placement(phy, phy.shape[1], 4)
    p.info["layer_ids"] = MOE_LAYERS[model_type]
    return p.validate()


def logits(model_dir, x):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=x).logits


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {mt: tiny_checkpoint(mt, root / mt) for mt in MOE_LAYERS}


@pytest.mark.parametrize("model_type", list(MOE_LAYERS))
def test_permuted_sharded_checkpoint_is_lossless(checkpoints, model_type, tmp_path):
    src = checkpoints[model_type]
    N, L = num_experts(model_type), len(MOE_LAYERS[model_type])
    if model_type == "deepseek_v3":
        phy = group_preserving(N, 4, L, seed=1)
    else:
        rng = np.random.default_rng(1)
        phy = np.stack([rng.permutation(N) for _ in range(L)])
    out = permute_checkpoint(src, placement_for(model_type, phy), tmp_path / "perm")
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert index.keys() == json.loads((src / "model.safetensors.index.json").read_text())["weight_map"].keys()
    x = torch.from_numpy(np.random.default_rng(0).integers(2, 8192, (2, 24)))
    diff = (logits(src, x) - logits(out, x)).abs().max().item()
    assert diff <= 1e-5, f"{model_type}: max |logit diff| {diff}"
    from safetensors import safe_open

    # the experts really moved: the router rows of the first MoE layer are permuted
    def tensor(folder, key):
        with safe_open(folder / index[key], "pt") as f:
            return f.get_tensor(key)

    layer = MOE_LAYERS[model_type][0]
    key = next(k for k in index if f"layers.{layer}." in k and
               (k.endswith("gate.weight") or k.endswith("router.weight")))
    assert torch.equal(tensor(out, key), tensor(src, key)[torch.from_numpy(phy[0])])
    assert not torch.equal(tensor(out, key), tensor(src, key))


def test_experts_of_a_layer_span_shards(checkpoints):
    """The case the index rewrite is for: one layer's per-expert tensors in two shard files."""
    for model_type in MOE_LAYERS:
        index = json.loads((checkpoints[model_type] / "model.safetensors.index.json").read_text())
        files = {}
        for key, f in index["weight_map"].items():
            if ".experts." in key:
                files.setdefault(key.split(".experts.")[0], set()).add(f)
        assert any(len(s) > 1 for s in files.values()), model_type


def test_group_crossing_placement_is_refused(checkpoints, tmp_path):
    N, L = num_experts("deepseek_v3"), 3
    phy = np.stack([np.roll(np.arange(N), 1) for _ in range(L)])  # expert 15 -> slot 0: crosses
    p = placement_for("deepseek_v3", phy)
    assert groups_crossed(p, 4) == [2, 3, 4]
    with pytest.raises(InputError, match="across the model's 4 expert groups in 3 layers"):
        permute_checkpoint(checkpoints["deepseek_v3"], p, tmp_path / "perm")
    assert not (tmp_path / "perm").exists()


def test_group_crossing_really_changes_the_model(checkpoints, tmp_path, monkeypatch):
    """Why the refusal: written anyway, the group-crossing checkpoint is another model."""
    import sempar.export.checkpoint as ck

    N = num_experts("deepseek_v3")
    phy = np.stack([np.roll(np.arange(N), 1) for _ in range(3)])
    monkeypatch.setattr(ck, "_limiting_groups", lambda model_dir: 1)
    src = checkpoints["deepseek_v3"]
    out = permute_checkpoint(src, placement_for("deepseek_v3", phy), tmp_path / "perm")
    x = torch.from_numpy(np.random.default_rng(0).integers(2, 8192, (2, 24)))
    assert (logits(src, x) - logits(out, x)).abs().max().item() > 1e-3


def test_groups_crossed():
    p = Placement(group_preserving(16, 4, 2, seed=0), 16, 4)
    assert groups_crossed(p, 4) == [] and groups_crossed(p, 1) == []
    assert groups_crossed(p, 8) != []            # within 4-groups is not within 8-groups
    p.phy2log[1, [0, 4]] = p.phy2log[1, [4, 0]]
    assert groups_crossed(p, 4) == [1]


def test_router_not_found_is_refused(checkpoints, tmp_path):
    """A checkpoint whose router is named otherwise: refused, not silently half-permuted."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "src"
    src.mkdir()
    for f in checkpoints["gpt_oss"].iterdir():
        if f.suffix == ".safetensors":
            save_file({k.replace("mlp.router.", "mlp.scorer."): v for k, v in load_file(f).items()},
                      src / f.name, metadata={"format": "pt"})
    (src / "config.json").write_text((checkpoints["gpt_oss"] / "config.json").read_text())
    phy = np.stack([np.random.default_rng(2).permutation(8) for _ in range(2)])
    with pytest.raises(InputError, match="no router .* MoE layer 0"):
        permute_checkpoint(src, placement_for("gpt_oss", phy), tmp_path / "perm")
    assert not (tmp_path / "perm").exists()
