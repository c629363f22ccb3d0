"""Model shapes of the MoE models sempar's users serve, by name (`sempar synth --preset`).

Figures from the models' published configurations (config.json of each checkpoint). A preset's
L columns are the model's MoE layers only, and it names them by their layer number in the model
(`layer_ids`) out of `num_hidden_layers`: DeepSeek models keep their first
`first_k_dense_replace` layers dense (V2-Lite: layer 0, MoE layers 1..26; V3: layers 0..2, MoE
layers 3..60). Engines index placement rows by that layer number (SGLang's
`--init-expert-location` has one row per hidden layer), so a synthetic trace must carry it.
"""

from __future__ import annotations

from sempar.registry import Registry
from sempar.trace.schema import TraceMeta

# A preset is the TraceMeta a trace of that model carries (model = the preset's name).
PRESETS: Registry[TraceMeta] = Registry("preset")


def _preset(name: str, model_type: str, num_hidden_layers: int, first_k_dense_replace: int,
            num_experts: int, top_k: int, vocab_size: int, **kw) -> TraceMeta:
    ids = tuple(range(first_k_dense_replace, num_hidden_layers))
    return TraceMeta(name, len(ids), num_experts, top_k, vocab_size, layer_ids=ids,
                     num_hidden_layers=num_hidden_layers, model_type=model_type, **kw)


for _shape in (
    # Mixtral-8x7B: 32 layers, all MoE; 8 experts, top-2, 32,000 tokens.
    _preset("mixtral-8x7b", "mixtral", 32, 0, 8, 2, 32000),
    # DeepSeek-V2-Lite: 27 layers, first_k_dense_replace 1; 64 routed + 2 shared, top-6;
    # 102,400 tokens.
    _preset("deepseek-v2-lite", "deepseek_v2", 27, 1, 64, 6, 102400, shared_experts=2),
    # OLMoE-1B-7B: 16 layers, all MoE; 64 experts, top-8; 50,304 embedding rows.
    _preset("olmoe-1b-7b", "olmoe", 16, 0, 64, 8, 50304),
    # Qwen3-30B-A3B: 48 layers, all MoE (decoder_sparse_step 1, no mlp_only_layers);
    # 128 experts, top-8; 151,936 tokens.
    _preset("qwen3-30b-a3b", "qwen3_moe", 48, 0, 128, 8, 151936),
    # DeepSeek-V3: 61 layers, first_k_dense_replace 3; 256 routed + 1 shared, top-8 within
    # at most 4 of 8 expert groups; 129,280 tokens.
    _preset("deepseek-v3", "deepseek_v3", 61, 3, 256, 8, 129280, shared_experts=1,
            num_expert_groups=8, topk_groups=4),
    # GPT-OSS-20B: 24 layers, all MoE; 32 experts, top-4; 201,088 tokens.
    _preset("gpt-oss-20b", "gpt_oss", 24, 0, 32, 4, 201088),
):
    PRESETS.add(_shape.model, _shape)

# hidden_size of each preset's model (config.json of each checkpoint): what one token's hidden
# state weighs in the communication model. Kept beside the presets rather than in the trace
# metadata, so synthetic traces stay as they were.
HIDDEN_SIZES = {"mixtral-8x7b": 4096, "deepseek-v2-lite": 2048, "olmoe-1b-7b": 2048,
                "qwen3-30b-a3b": 2048, "deepseek-v3": 7168, "gpt-oss-20b": 2880}
