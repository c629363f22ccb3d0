"""Model dimensions the serving roofline needs, keyed by the model preset's name.

The presets' read from the one table of real models, `sempar.model_presets` (each checkpoint's
published config.json); the tiny models' from their config.json in assets/models. Kept out of
`TraceMeta`: the routing trace stays routing only.

Attention, per layer and token: `attn_params` weights (Q, K, V, O projections; for MLA the
down/up projections of DeepSeek-V2 §2.1), `kv_elems` cached elements per token (GQA: 2 x KV heads
x head_dim; MLA: kv_lora_rank + rope dim = 576, with the absorbed up-projections), and
`attn_flops_ctx` FLOPs per (query token, cached token) pair (GQA: 4 x heads x head_dim for QK^T and
PV; MLA absorbed: 2 x heads x (576 + 512)).
"""

from __future__ import annotations

from dataclasses import dataclass

from sempar.errors import InputError
from sempar.model_presets import MODEL_PRESETS, ModelPreset


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


def _dims(p: ModelPreset) -> ModelDims:
    return ModelDims(p.name, p.hidden, p.heads, p.kv_heads, p.head_dim, p.moe_intermediate,
                     p.moe_layers, p.dense_layers, p.dense_intermediate, p.vocab, p.experts,
                     p.top_k, shared_experts=p.shared_experts, mla=p.mla)


# GPT-OSS-20B's experts are MXFP4 and every other layer attends to a 128-token window: here bf16
# weights and full attention, so decode reads and long-context attention are over-, not
# under-estimated.
DIMS: dict[str, ModelDims] = {name: _dims(p) for name, p in MODEL_PRESETS.items()}


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


# Sizes of a model shape taken from a user's file (a checkpoint's config.json, a line's dims):
# far beyond any real MoE (DeepSeek-V3: hidden 7168, 128 heads, 256 experts, 61 layers) and
# far below what makes a measurement or a price meaningless or unbounded.
DIM_LIMITS = {"hidden": (1, 1 << 16), "heads": (1, 1 << 10), "kv_heads": (1, 1 << 10),
              "head_dim": (1, 1 << 12), "moe_intermediate": (1, 1 << 18),
              "moe_layers": (1, 10_000), "dense_layers": (0, 10_000),
              "dense_intermediate": (0, 1 << 18), "vocab": (1, 2**31 - 1),
              "num_experts": (1, 1 << 20), "top_k": (1, 1 << 20), "shared_experts": (0, 1 << 10),
              "shared_intermediate": (0, 1 << 18), "dtype_bytes": (1, 8)}


def check_dims(d: ModelDims, where: str) -> ModelDims:
    """`d` when every size is an integer in `DIM_LIMITS`, top-k at most the experts and the
    MLA ranks sane; else one line naming the field (before any measuring or pricing). Every
    ModelDims read from a user's file goes through it: `calibrate --model-dir`, measurement
    lines (`calibrate.lines`), profile entries (`accel_profile`)."""
    if not isinstance(d.name, str) or not d.name.strip() or len(d.name) > 200:
        raise InputError(f"{where}: the model name {str(d.name)[:40]!r} is not a name")
    for name, (lo, hi) in DIM_LIMITS.items():
        v = getattr(d, name)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise InputError(f"{where}: {name} {v!r} is not an integer in [{lo}, {hi}]")
    if d.top_k > d.num_experts:
        raise InputError(f"{where}: top_k {d.top_k} exceeds num_experts {d.num_experts}")
    if d.dense_layers and not d.dense_intermediate:
        raise InputError(f"{where}: {d.dense_layers} dense layers of intermediate size 0")
    if d.mla is not None:
        ranks = d.mla if isinstance(d.mla, tuple) else ()
        if len(ranks) != 4 or 0 in ranks[1:] or any(
                isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 16
                for v in ranks):
            raise InputError(f"{where}: mla {d.mla!r} is not (q_lora_rank, kv_lora_rank, rope, "
                             "nope) with the last three positive")
    return d
