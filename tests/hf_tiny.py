"""Tiny random-init HF MoE checkpoints, saved sharded like hub checkpoints, for the export tests.

Each config keeps its family's MoE structure (Mixtral's per-expert tensors, Qwen3-MoE's and
GPT-OSS's fused experts, DeepSeek-V3's dense first layers, 4 expert groups with top-2 groups and
a correction bias, GPT-OSS's router bias) at widths small enough to build in a second. Weights
are drawn with a fixed seed; a small shard size splits the layers' experts over several files.
"""

from __future__ import annotations

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


def tiny_checkpoint(model_type: str, out: Path, shards: int = 3, seed: int = 0) -> Path:
    """Save `tiny_model(model_type)` to `out` in about `shards` safetensors files (+ index)."""
    model = tiny_model(model_type, seed)
    total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    model.save_pretrained(out, max_shard_size=max(total // shards, 1) if shards > 1 else "10GB")
    return out
