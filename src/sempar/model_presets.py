"""The real MoE models sempar's users serve, each model's shape written once (`--preset`).

Figures from each checkpoint's published config.json. Read by `trace.presets` (the TraceMeta a
synthetic trace carries, and each model's hidden size for the communication model),
`serving.dims` (the roofline's dimensions) and `serving.deploy` (SGLang's `--model-path`); the
README's and docs/cli.md's presets lines and the `--preset` helps are generated from it
(`names`, `describe`; tests/models/test_model_presets.py checks the docs).

A preset's MoE layers are layers `dense_layers .. layers - 1` of the model (DeepSeek's
`first_k_dense_replace` keeps the first ones dense); engines index placement rows by that layer
number (SGLang's `--init-expert-location` has one row per hidden layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from sempar.families import DEEPSEEK_V2, DEEPSEEK_V3, GPT_OSS, MIXTRAL, OLMOE, QWEN3_MOE, Family


@dataclass(frozen=True)
class ModelPreset:
    """One real model's shape.

    layers: num_hidden_layers; dense_layers: the first layers without experts
    (first_k_dense_replace); experts / top_k / shared_experts: routed experts, experts per
    token, always-on shared experts; groups / topk_groups: group-limited routing (n_group,
    topk_group); hidden: hidden_size; moe_intermediate: one routed expert's intermediate size;
    dense_intermediate: a dense layer's MLP (0 without dense layers); heads / kv_heads /
    head_dim: attention; mla: (q_lora_rank or 0, kv_lora_rank, rope dim, nope dim) for
    multi-head latent attention, else None; vocab: embedding rows; model_path: the
    checkpoint's Hugging Face repository (what an engine's --model-path names)."""

    name: str
    family: Family
    layers: int
    dense_layers: int
    experts: int
    top_k: int
    hidden: int
    moe_intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    model_path: str
    shared_experts: int = 0
    groups: int = 1
    topk_groups: int = 1
    dense_intermediate: int = 0
    mla: tuple[int, int, int, int] | None = None

    @property
    def model_type(self) -> str:
        return self.family.model_type

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    def describe(self) -> str:
        """One line for the docs: "`name` (L MoE layers, N experts, top-k[, ...])"."""
        parts = [f"{self.moe_layers} MoE layers", f"{self.experts} experts", f"top-{self.top_k}"]
        if self.shared_experts:
            parts.append(f"{self.shared_experts} shared")
        if self.groups > 1:
            parts.append(f"top-{self.topk_groups} of {self.groups} groups")
        return f"`{self.name}` ({', '.join(parts)})"


MODEL_PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    # Mixtral-8x7B: 32 layers, all MoE; GQA 32 heads / 8 KV heads of 128.
    ModelPreset("mixtral-8x7b", MIXTRAL, 32, 0, 8, 2, 4096, 14336, 32, 8, 128, 32000,
                "mistralai/Mixtral-8x7B-v0.1"),
    # DeepSeek-V2-Lite: 27 layers, the first dense (intermediate 10944); 64 routed + 2 shared;
    # MLA without q compression.
    ModelPreset("deepseek-v2-lite", DEEPSEEK_V2, 27, 1, 64, 6, 2048, 1408, 16, 16, 128, 102400,
                "deepseek-ai/DeepSeek-V2-Lite", shared_experts=2, dense_intermediate=10944,
                mla=(0, 512, 64, 128)),
    # OLMoE-1B-7B: 16 layers, all MoE; 50,304 embedding rows.
    ModelPreset("olmoe-1b-7b", OLMOE, 16, 0, 64, 8, 2048, 1024, 16, 16, 128, 50304,
                "allenai/OLMoE-1B-7B-0924"),
    # Qwen3-30B-A3B: 48 layers, all MoE (decoder_sparse_step 1, no mlp_only_layers).
    ModelPreset("qwen3-30b-a3b", QWEN3_MOE, 48, 0, 128, 8, 2048, 768, 32, 4, 128, 151936,
                "Qwen/Qwen3-30B-A3B"),
    # DeepSeek-V3: 61 layers, the first 3 dense (intermediate 18432); 256 routed + 1 shared,
    # top-8 within at most 4 of 8 expert groups; MLA.
    ModelPreset("deepseek-v3", DEEPSEEK_V3, 61, 3, 256, 8, 7168, 2048, 128, 128, 128, 129280,
                "deepseek-ai/DeepSeek-V3", shared_experts=1, groups=8, topk_groups=4,
                dense_intermediate=18432, mla=(1536, 512, 64, 128)),
    # GPT-OSS-20B: 24 layers, all MoE; GQA 64 heads / 8 KV heads of 64. The checkpoint's experts
    # are MXFP4 and every other layer attends to a 128-token window (the roofline counts bf16
    # weights and full attention: serving/dims.py).
    ModelPreset("gpt-oss-20b", GPT_OSS, 24, 0, 32, 4, 2880, 2880, 64, 8, 64, 201088,
                "openai/gpt-oss-20b"),
)}


def names() -> list[str]:
    """Preset names in table order (what `--preset` helps list)."""
    return list(MODEL_PRESETS)


def names_line() -> str:
    """The README's presets line: "`a`, `b`, ..."."""
    return ", ".join(f"`{n}`" for n in MODEL_PRESETS)


def describe_line() -> str:
    """docs/cli.md's presets line: each preset with its shape."""
    return ", ".join(p.describe() for p in MODEL_PRESETS.values())
