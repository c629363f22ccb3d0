"""Model dimensions the serving roofline needs, keyed by the model preset's name (trace/presets.py).

From each checkpoint's published config.json (hidden_size, num_attention_heads,
num_key_value_heads, head_dim, moe_intermediate_size / intermediate_size, first_k_dense_replace,
n_shared_experts, vocab_size); the tiny models' from their config.json in assets/models. Kept here,
beside the one consumer, rather than widening `TraceMeta`: the routing trace stays routing only.

Attention, per layer and token: `attn_params` weights (Q, K, V, O projections; for MLA the
down/up projections of DeepSeek-V2 §2.1), `kv_elems` cached elements per token (GQA: 2 x KV heads
x head_dim; MLA: kv_lora_rank + rope dim = 576, with the absorbed up-projections), and
`attn_flops_ctx` FLOPs per (query token, cached token) pair (GQA: 4 x heads x head_dim for QK^T and
PV; MLA absorbed: 2 x heads x (576 + 512)).
"""

from __future__ import annotations

from dataclasses import dataclass

from sempar.errors import InputError


@dataclass(frozen=True)
class ModelDims:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    moe_intermediate: int
    moe_layers: int
    dense_layers: int
    dense_intermediate: int
    vocab: int
    num_experts: int
    top_k: int
    shared_experts: int = 0
    shared_intermediate: int = 0     # per shared expert (defaults to moe_intermediate)
    mla: tuple[int, int, int, int] | None = None   # (q_lora_rank or 0, kv_lora_rank, rope, nope)
    dtype_bytes: int = 2

    @property
    def layers(self) -> int:
        return self.moe_layers + self.dense_layers

    @property
    def attn_params(self) -> int:
        h, nh, hd = self.hidden, self.heads, self.head_dim
        if self.mla is None:
            return h * nh * hd + 2 * h * self.kv_heads * hd + nh * hd * h
        q_lora, kv_lora, rope, nope = self.mla
        qk = nope + rope
        q = h * nh * qk if not q_lora else h * q_lora + q_lora * nh * qk
        return q + h * (kv_lora + rope) + kv_lora * nh * (nope + hd) + nh * hd * h

    @property
    def kv_elems(self) -> int:
        if self.mla is None:
            return 2 * self.kv_heads * self.head_dim
        return self.mla[1] + self.mla[2]

    @property
    def attn_flops_ctx(self) -> int:
        if self.mla is None:
            return 4 * self.heads * self.head_dim
        return 2 * self.heads * (self.mla[1] + self.mla[2] + self.mla[1])

    @property
    def expert_params(self) -> int:
        """One routed expert: gate, up and down projections (SwiGLU)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def shared_params(self) -> int:
        return 3 * self.hidden * (self.shared_intermediate or self.moe_intermediate) * self.shared_experts

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.dense_intermediate

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token holds over all layers."""
        return self.kv_elems * self.layers * self.dtype_bytes


DIMS: dict[str, ModelDims] = {d.name: d for d in (
    ModelDims("mixtral-8x7b", 4096, 32, 8, 128, 14336, 32, 0, 0, 32000, 8, 2),
    # 27 layers, the first dense (intermediate 10944); MLA without q compression.
    ModelDims("deepseek-v2-lite", 2048, 16, 16, 128, 1408, 26, 1, 10944, 102400, 64, 6,
              shared_experts=2, mla=(0, 512, 64, 128)),
    ModelDims("olmoe-1b-7b", 2048, 16, 16, 128, 1024, 16, 0, 0, 50304, 64, 8),
    ModelDims("qwen3-30b-a3b", 2048, 32, 4, 128, 768, 48, 0, 0, 151936, 128, 8),
    ModelDims("deepseek-v3", 7168, 128, 128, 128, 2048, 58, 3, 18432, 129280, 256, 8,
              shared_experts=1, mla=(1536, 512, 64, 128)),
    # 24 layers, all MoE; GQA 64 heads / 8 KV heads of 64. The checkpoint's experts are MXFP4
    # and every other layer attends to a 128-token window: here bf16 weights and full
    # attention, so decode reads and long-context attention are over-, not under-estimated.
    ModelDims("gpt-oss-20b", 2880, 64, 8, 64, 2880, 24, 0, 0, 201088, 32, 4),
)}


def model_dims(model: str) -> ModelDims:
    """Dimensions of `model`: a preset name (also "synthetic:<preset>"), or a packaged tiny model
    whose config.json is read; InputError when neither."""
    base = model.split(":")[-1]
    if base in DIMS:
        return DIMS[base]
    from sempar.paths import packaged_model_dir
    from sempar.safe_json import read_json_object

    d = packaged_model_dir(base)
    cfg = d / "config.json" if d is not None else None
    if cfg is None or not cfg.is_file():
        raise InputError(f"model {model!r}: no serving dimensions known (presets: "
                         f"{', '.join(DIMS)}; or a packaged tiny model)")
    c = read_json_object(cfg, "model config.json")
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    dense = len(c.get("mlp_only_layers") or [])
    return ModelDims(base, c["hidden_size"], c["num_attention_heads"],
                     c.get("num_key_value_heads", c["num_attention_heads"]), hd,
                     c.get("moe_intermediate_size") or c["intermediate_size"],
                     c["num_hidden_layers"] - dense, dense, c.get("intermediate_size", 0),
                     c["vocab_size"], c["num_local_experts"], c["num_experts_per_tok"],
                     dtype_bytes=2)
