"""The tiny MoE models sempar trains on this CPU, registered by name.

Two routing regimes of the models our users serve:
- `tiny-mixtral`: MixtralForCausalLM, 8 experts, top-2 ("few large experts", like Mixtral-8x7B);
- `tiny-moe64`: Qwen3MoeForCausalLM, 64 routed experts, top-8 ("many small experts", like
  Qwen3-30B-A3B / OLMoE);
- `tiny-moe64-h8`: tiny-moe64 with 8 attention heads of 16 (4 KV heads), for G = 8 tensor
  parallelism.
All keep the router's load-balancing loss (coefficient 0.01), tie input and output embeddings
and are saved in bf16: about 14 + 22 + 22 MB of safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sempar.registry import Registry
from sempar.tiny.tokenizer import VOCAB_SIZE


@dataclass(frozen=True)
class TinySpec:
    name: str
    make_config: Callable[[], object]   # -> a transformers PretrainedConfig
    lr: float = 2e-3


TINY_MODELS: Registry[TinySpec] = Registry("tiny model")


def _mixtral():
    from transformers import MixtralConfig

    return MixtralConfig(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=320,
                         num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, num_local_experts=8, num_experts_per_tok=2,
                         max_position_embeddings=1024, tie_word_embeddings=True,
                         output_router_logits=True, router_aux_loss_coef=0.01,
                         bos_token_id=0, eos_token_id=0, pad_token_id=1)


def _moe64(heads: int = 4, kv_heads: int = 2, head_dim: int = 32):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256,
                          moe_intermediate_size=64, num_hidden_layers=6,
                          num_attention_heads=heads, num_key_value_heads=kv_heads,
                          head_dim=head_dim, num_experts=64,
                          num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
                          mlp_only_layers=[], max_position_embeddings=1024,
                          tie_word_embeddings=True, output_router_logits=True,
                          router_aux_loss_coef=0.01, bos_token_id=0, eos_token_id=0,
                          pad_token_id=1)


TINY_MODELS.add("tiny-mixtral", TinySpec("tiny-mixtral", _mixtral))
TINY_MODELS.add("tiny-moe64", TinySpec("tiny-moe64", _moe64))
# tiny-moe64 with its attention cut into 8 heads of 16 (4 KV heads, the same 2:1 GQA ratio), so
# tensor parallelism reaches G = 8 (s-MoE's headline setting); the projections keep their shapes
# (q/o 128x128, k/v 64x128), so the parameter count is tiny-moe64's but for the q/k norms.
TINY_MODELS.add("tiny-moe64-h8", TinySpec("tiny-moe64-h8",
                                          lambda: _moe64(heads=8, kv_heads=4, head_dim=16)))
