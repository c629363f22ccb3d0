"""A MoE model's shape from its Hugging Face `config.json`, without loading the model.

`config_shape(dir)` reads the fields the families sempar records (trace/routers.py) name
differently:

| field                | read from (first present)                                          |
| -------------------- | ------------------------------------------------------------------ |
| num_experts          | n_routed_experts (DeepSeek), num_local_experts (Mixtral, GPT-OSS),  |
|                      | num_experts (Qwen-MoE, OLMoE)                                       |
| top_k                | num_experts_per_tok, experts_per_token (GPT-OSS)                    |
| shared_experts       | the model type's rule in `families.FAMILIES` (n_shared_experts;     |
|                      | Qwen2-MoE: 1 when shared_expert_intermediate_size > 0)              |
| num_expert_groups    | n_group, topk_group (DeepSeek group-limited routing), else 1 / 1    |
| layer_ids            | the MoE layers of num_hidden_layers: DeepSeek's first_k_dense_replace |
|                      | and moe_layer_freq, Qwen2-MoE's decoder_sparse_step / mlp_only_layers |

plus vocab_size, num_hidden_layers and model_type. A field the config lacks is left out of the
result (the caller takes it from elsewhere).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sempar.errors import InputError


def _int(cfg: dict, names: tuple[str, ...], where: str) -> int | None:
    for n in names:
        v = cfg.get(n)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"{where}: {n}: {v!r} is not a non-negative integer")
        return v
    return None


def moe_layers(cfg: dict, n: int) -> list[int]:
    """The MoE layer numbers of 0..n-1 by the config's dense-layer rules (all n without any)."""
    first = cfg.get("first_k_dense_replace") or 0
    freq = cfg.get("moe_layer_freq") or 1
    step = cfg.get("decoder_sparse_step") or 1
    dense = set(cfg.get("mlp_only_layers") or [])
    return [i for i in range(n) if i >= first and i % freq == 0 and (i + 1) % step == 0
            and i not in dense]


def config_shape(model_dir: str | Path) -> dict[str, Any]:
    """{num_experts, top_k, shared_experts, num_expert_groups, topk_groups, vocab_size,
    num_hidden_layers, model_type, layer_ids}: those of DIR/config.json's model it names."""
    from sempar.safe_json import read_json_object
    from sempar.families import FAMILIES, n_shared_experts

    path = Path(model_dir) / "config.json"
    cfg = read_json_object(path, "--model-dir config.json")
    if isinstance(cfg.get("text_config"), dict):      # multimodal wrappers keep the LM inside
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type",
                                                                            cfg.get("model_type"))}
    out: dict[str, Any] = {}
    for key, names in (("num_experts", ("n_routed_experts", "num_local_experts", "num_experts")),
                       ("top_k", ("num_experts_per_tok", "experts_per_token")),
                       ("vocab_size", ("vocab_size",)),
                       ("num_hidden_layers", ("num_hidden_layers",))):
        v = _int(cfg, names, str(path))
        if v is not None:
            out[key] = v
    if "num_experts" not in out:
        raise InputError(f"{path}: no expert count (n_routed_experts, num_local_experts or "
                         "num_experts): not a MoE config")
    model_type = cfg.get("model_type")
    if isinstance(model_type, str):
        out["model_type"] = model_type
    spec = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    out["shared_experts"] = int((spec.shared_experts if spec else n_shared_experts)(
        SimpleNamespace(**cfg)))
    groups = _int(cfg, ("n_group",), str(path)) or 1
    topk_groups = _int(cfg, ("topk_group",), str(path)) or groups
    out["num_expert_groups"], out["topk_groups"] = groups, min(topk_groups, groups)
    if "num_hidden_layers" in out:
        out["layer_ids"] = tuple(moe_layers(cfg, out["num_hidden_layers"]))
    return out
