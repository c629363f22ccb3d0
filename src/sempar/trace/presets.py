"""Model shapes of the MoE models sempar's users serve, by name (`sempar synth --preset`).

Figures from the models' published configurations (config.json of each checkpoint):
layers counted are the MoE layers only (DeepSeek models keep their first layers dense).
"""

from __future__ import annotations

from sempar.registry import Registry
from sempar.trace.schema import TraceMeta

# A preset is the TraceMeta a trace of that model carries (model = the preset's name).
PRESETS: Registry[TraceMeta] = Registry("preset")

for _shape in (
    # Mixtral-8x7B: 32 layers, 8 experts, top-2, 32,000 tokens.
    TraceMeta("mixtral-8x7b", 32, 8, 2, 32000),
    # DeepSeek-V2-Lite: 27 layers, the first dense; 64 routed + 2 shared, top-6; 102,400 tokens.
    TraceMeta("deepseek-v2-lite", 26, 64, 6, 102400, shared_experts=2),
    # OLMoE-1B-7B: 16 layers, 64 experts, top-8; 50,304 embedding rows.
    TraceMeta("olmoe-1b-7b", 16, 64, 8, 50304),
    # Qwen3-30B-A3B: 48 layers, 128 experts, top-8; 151,936 tokens.
    TraceMeta("qwen3-30b-a3b", 48, 128, 8, 151936),
    # DeepSeek-V3: 61 layers, the first 3 dense; 256 routed + 1 shared, top-8 within at most
    # 4 of 8 expert groups; 129,280 tokens.
    TraceMeta("deepseek-v3", 58, 256, 8, 129280, shared_experts=1, num_expert_groups=8,
              topk_groups=4),
):
    PRESETS.add(_shape.model, _shape)
