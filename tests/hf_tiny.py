"""Tiny random-init HF MoE checkpoints, saved sharded like hub checkpoints, for the export tests.

Each config keeps its family's MoE structure (Mixtral's and Qwen3-MoE's per-expert tensors on
disk, GPT-OSS's fused experts, DeepSeek-V3's dense first layers, 4 expert groups with top-2 groups and
a correction bias, GPT-OSS's router bias) at widths small enough to build in a second. Weights
are drawn with a fixed seed; the checkpoint is resharded as hub checkpoints are, so each
layer's experts span several files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

COMMON = dict(vocab_size=8192, hidden_size=32, intermediate_size=64, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
              tie_word_embeddings=False)

CONFIGS = {
    "mixtral": ("MixtralConfig", dict(num_hidden_layers=2, num_local_experts=8,
                                      num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_hidden_layers=2, num_experts=16, num_experts_per_tok=4,
                                         moe_intermediate_size=16, decoder_sparse_step=1,
                                         mlp_only_layers=[], norm_topk_prob=True)),
    "deepseek_v3": ("DeepseekV3Config", dict(
        num_hidden_layers=5, first_k_dense_replace=2, num_key_value_heads=4, n_routed_experts=16, n_shared_experts=1,
        num_experts_per_tok=4, n_group=4, topk_group=2, moe_intermediate_size=16,
        kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
        routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    "deepseek_v2": ("DeepseekV2Config", dict(
        num_hidden_layers=4, first_k_dense_replace=1, n_routed_experts=16, n_shared_experts=2,
        num_experts_per_tok=6, n_group=1, topk_group=1, moe_intermediate_size=16,
        num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, topk_method="greedy",
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    "gpt_oss": ("GptOssConfig", dict(num_hidden_layers=2, num_local_experts=8,
                                     num_experts_per_tok=2, sliding_window=16,
                                     layer_types=["sliding_attention", "full_attention"])),
}


def tiny_model(model_type: str, seed: int = 0):
    """A random-init float32 model of the family, in eval mode."""
    import torch
    import transformers

    cls, kw = CONFIGS[model_type]
    config = getattr(transformers, cls)(**{**COMMON, **kw})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            # biases and DeepSeek's e_score_correction_bias start at 0: make them matter
            if param.ndim == 1 and not name.endswith("norm.weight"):
                param.normal_(0, 0.5)
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.normal_(0, 0.5)
    return model


def tiny_checkpoint(model_type: str, out: Path, shard_kb: int | None = 100, seed: int = 0) -> Path:
    """Save `tiny_model(model_type)` to `out`, resharded as hub checkpoints are (`reshard`)."""
    model = tiny_model(model_type, seed)
    model.save_pretrained(out)
    if shard_kb:
        reshard(out, shard_kb)
    return out


def _natural(key: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


def reshard(folder: Path, shard_kb: int) -> None:
    """Rewrite `folder`'s safetensors as hub checkpoints lay them out: tensors in natural key
    order (layer by layer, expert 0, 1, ... each with all its projections), cut into shards of
    about `shard_kb` KB, with `model.safetensors.index.json`. 100 KB is less than one tiny
    layer's experts, so a layer's experts span shard files (transformers 5's own
    `save_pretrained` groups an MoE layer's experts by projection instead, which never does)."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(f))
        f.unlink()
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    shards, size = [[]], 0
    for key in sorted(tensors, key=_natural):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if shards[-1] and size + nbytes > shard_kb * 1024:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    weight_map = {}
    for i, keys in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in keys}, folder / name, metadata={"format": "pt"})
        weight_map.update((k, name) for k in keys)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
