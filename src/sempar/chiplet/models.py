"""MoE model shapes of FSE-DP Table I and the bytes of their weights under a precision.

Table I gives D_model, D_ffn (per-expert width), E, E^act and heads; the MoE layer counts are
from the models' published configurations (DeepSeek-MoE-16B keeps its first layer dense).
An expert is a gated FFN: three D_model x D_ffn matrices (gate, up, down), so
`expert_params = 3 * d_model * d_expert`. Shared experts (DeepSeek-MoE's "+2") are activated by
every token; the simulator treats them as extra experts with all tokens (ours).
"""

from __future__ import annotations

from dataclasses import dataclass

from sempar.errors import InputError
from sempar.registry import Registry

PRECISION_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0,
                                     "fp8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class MoEModel:
    """One row of Table I (plus its MoE layer count)."""

    name: str
    d_model: int
    d_expert: int
    experts: int          # routed experts per layer (E)
    top_k: int            # routed experts per token (E^act without shared)
    shared: int           # shared experts per layer (always active)
    heads: int
    layers: int           # MoE layers
    params_b: float       # total parameters (billions), Table I

    @property
    def expert_params(self) -> int:
        return 3 * self.d_model * self.d_expert

    @property
    def total_experts(self) -> int:
        """Routed + shared: the experts the simulator schedules per layer."""
        return self.experts + self.shared

    @property
    def attn_params(self) -> int:
        """Q, K, V, O projections, D_model x D_model each (ours: grouped KV heads ignored)."""
        return 4 * self.d_model * self.d_model

    def expert_bytes(self, precision: str) -> float:
        return self.expert_params * precision_bytes(precision)


def precision_bytes(precision: str) -> float:
    try:
        return PRECISION_BYTES[precision]
    except KeyError:
        raise InputError(f"--precision: unknown {precision!r}; choose one of: "
                         f"{', '.join(PRECISION_BYTES)}") from None


MODELS: Registry[MoEModel] = Registry("model")
for _m in (
    MoEModel("phi-3.5-moe", 4096, 3200, 16, 2, 0, 32, 32, 41.9),
    MoEModel("yuan2.0-m32", 2048, 4096, 32, 2, 0, 16, 24, 40.0),
    MoEModel("deepseek-moe-16b", 2048, 1408, 64, 6, 2, 16, 27, 16.4),
    MoEModel("qwen3-30b-a3b", 2048, 768, 128, 8, 0, 32, 48, 30.0),
):
    MODELS.add(_m.name, _m)
