"""Model shapes of the MoE models sempar's users serve, by name (`sempar synth --preset`).

Read from the one table of real models, `sempar.model_presets` (each checkpoint's published
config.json). A preset's L columns are the model's MoE layers only, and it names them by their
layer number in the model (`layer_ids`) out of `num_hidden_layers`: DeepSeek models keep their
first `first_k_dense_replace` layers dense (V2-Lite: layer 0, MoE layers 1..26; V3: layers
0..2, MoE layers 3..60). Engines index placement rows by that layer number (SGLang's
`--init-expert-location` has one row per hidden layer), so a synthetic trace must carry it.
"""

from __future__ import annotations

from sempar.model_presets import MODEL_PRESETS, ModelPreset
from sempar.registry import Registry
from sempar.trace.schema import TraceMeta

# A preset is the TraceMeta a trace of that model carries (model = the preset's name).
PRESETS: Registry[TraceMeta] = Registry("preset")


def _meta(p: ModelPreset) -> TraceMeta:
    ids = tuple(range(p.dense_layers, p.layers))
    return TraceMeta(p.name, len(ids), p.experts, p.top_k, p.vocab, layer_ids=ids,
                     num_hidden_layers=p.layers, model_type=p.model_type,
                     shared_experts=p.shared_experts, num_expert_groups=p.groups,
                     topk_groups=p.topk_groups)


for _p in MODEL_PRESETS.values():
    PRESETS.add(_p.name, _meta(_p))

# hidden_size of each preset's model: what one token's hidden state weighs in the communication
# model. Kept beside the presets rather than in the trace metadata, so synthetic traces stay as
# they were.
HIDDEN_SIZES = {p.name: p.hidden for p in MODEL_PRESETS.values()}
