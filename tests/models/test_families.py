"""Every registered model family (`sempar.families`) through the recorder, the cost-aware gate
hook and the pre-router on a tiny random-weight HF model of that family (built from a config,
nothing downloaded): the three select the same experts. And each HF model_type literal lives in
its record only (at most one other module under src/sempar)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sempar.families import FAMILIES, family, refused_by  # noqa: E402
from sempar.costroute.hook import CostRoutingHook  # noqa: E402
from sempar.schedule.prerouter import PreRouter  # noqa: E402
from sempar.trace.routers import RoutingCapture, find_routers, trace_meta_for  # noqa: E402

V = 256
COMMON = dict(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)
MLA = dict(num_key_value_heads=4, n_routed_experts=16, num_experts_per_tok=4,
           moe_intermediate_size=16, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
           qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)


def _config(case: str):
    t = transformers
    return {
        "mixtral": lambda: t.MixtralConfig(**COMMON, num_local_experts=8, num_experts_per_tok=2),
        "qwen2_moe": lambda: t.Qwen2MoeConfig(**COMMON, num_experts=8, num_experts_per_tok=2,
                                              moe_intermediate_size=16,
                                              shared_expert_intermediate_size=16,
                                              mlp_only_layers=[1]),
        "qwen3_moe": lambda: t.Qwen3MoeConfig(**COMMON, num_experts=16, num_experts_per_tok=4,
                                              moe_intermediate_size=16, head_dim=8,
                                              norm_topk_prob=True),
        "olmoe": lambda: t.OlmoeConfig(**COMMON, num_experts=16, num_experts_per_tok=3),
        "deepseek_v2": lambda: t.DeepseekV2Config(**{**COMMON, **MLA}, n_shared_experts=2,
                                                  n_group=4, topk_group=2,
                                                  topk_method="group_limited_greedy",
                                                  routed_scaling_factor=1.5),
        "deepseek_v2-greedy": lambda: t.DeepseekV2Config(**{**COMMON, **MLA}, n_shared_experts=2,
                                                         n_group=1, topk_group=1,
                                                         topk_method="greedy"),
        "deepseek_v3": lambda: t.DeepseekV3Config(**{**COMMON, **MLA}, n_shared_experts=1,
                                                  n_group=4, topk_group=2, norm_topk_prob=True,
                                                  routed_scaling_factor=2.5),
        "gpt_oss": lambda: t.GptOssConfig(**COMMON, num_local_experts=8, num_experts_per_tok=2,
                                          head_dim=8, sliding_window=4,
                                          rope_parameters={"rope_type": "default",
                                                           "rope_theta": 10000.0}),
    }[case]()


CASES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v2-greedy",
         "deepseek_v3", "gpt_oss"]


def test_every_registered_family_has_a_case():
    assert {c.split("-")[0] for c in CASES} == set(FAMILIES)


def _model(case: str):
    cfg = _config(case)
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for site in find_routers(model):
            r = site.module        # decisive routers (logit std ~ 3): float noise cannot tie
            r.weight.copy_(torch.randn(r.weight.shape, generator=g) * 0.5)
            for name in ("bias", "e_score_correction_bias"):
                if getattr(r, name, None) is not None:
                    getattr(r, name).copy_(torch.randn(r.num_experts, generator=g) * 0.3)
    return model


@pytest.mark.parametrize("case", CASES)
def test_recorder_hook_and_prerouter_select_the_same_experts(case):
    model = _model(case)
    fam = family(model.config.model_type)
    sites = find_routers(model)
    meta = trace_meta_for(model, sites, case)
    moe = [ly for ly in model.model.layers if fam.router_of(ly) is not None]
    assert [s.module for s in sites] == [fam.router_of(ly) for ly in moe]
    ids = torch.randint(3, V, (2, 24), generator=torch.Generator().manual_seed(3))
    residual: list[torch.Tensor] = []
    handles = [ly.post_attention_layernorm.register_forward_pre_hook(
        lambda m, a: residual.append(a[0].reshape(-1, a[0].shape[-1]))) for ly in moe]

    def run(hook=None):
        with RoutingCapture(sites, meta.top_k, meta.num_experts) as cap, torch.no_grad():
            cap.expect(ids.numel())
            if hook is None:
                model(input_ids=ids, use_cache=False)
            else:
                with hook:
                    model(input_ids=ids, use_cache=False)
            return cap.take()

    try:
        recorded, w_rec = run()                    # the recorder: the router's own choice
    finally:
        for h in handles:
            h.remove()
    # the cost-aware hook's re-implementation (forced on with a zero table) chooses the same
    # experts with the same weights, bit for bit
    zero = np.zeros((len(sites), 2, meta.num_experts), np.float32)
    hooked, w_hook = run(CostRoutingHook(model, zero, passthrough_at_zero=False))
    assert np.array_equal(hooked, recorded)
    assert np.array_equal(w_hook, w_rec)
    # the pre-router, given the norm's input r (z = W(w ⊙ r), s = the norm's own scale),
    # selects the same expert sets
    pre = []
    for l, ly in enumerate(moe):
        pr = PreRouter.from_layer(ly, model.config.model_type)
        assert pr.exact == (fam.prerouting == "exact")
        r = residual[l]
        pre.append(pr.select(pr.partial_logits(r), pr.residual_scale(r)).sort(dim=1).values)
    pre_ids = torch.stack(pre, 1).numpy()
    same = (pre_ids == np.sort(recorded, axis=2)).all(axis=2)
    print(f"\n{case}: pre-router = router on {same.mean():.4f} of (token, layer) pairs")
    assert same.all()


def test_a_nonzero_bias_moves_the_hook_and_the_prerouter_alike():
    """The hook's biased choice and the pre-router's rule on the biased logits are one rule."""
    model = _model("qwen3_moe")
    sites = find_routers(model)
    router = sites[0].module
    table = np.zeros((len(sites), 1, router.num_experts), np.float32)
    table[:, 0, 5] = 40.0
    meta = trace_meta_for(model, sites, "q")
    ids = torch.randint(3, V, (1, 16), generator=torch.Generator().manual_seed(5))
    with RoutingCapture(sites, meta.top_k, meta.num_experts) as cap, torch.no_grad():
        cap.expect(ids.numel())
        with CostRoutingHook(model, table):
            model(input_ids=ids, use_cache=False)
        hooked, _ = cap.take()
    assert (hooked == 5).any(axis=2).all()


def test_model_type_literals_live_in_their_record():
    src = Path(__file__).resolve().parents[2] / "src" / "sempar"
    where: dict[str, set[str]] = defaultdict(set)
    for f in src.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in FAMILIES:
                where[node.value].add(str(f.relative_to(src)))
    for mt in FAMILIES:
        assert "families.py" in where[mt], mt
        assert len(where[mt]) <= 2, (mt, sorted(where[mt]))


def test_engines_read_the_records():
    from sempar.export.engines import ENGINES

    for name in ("sglang", "vllm"):
        assert ENGINES.get(name).cannot_place == refused_by(name)
    assert refused_by("sglang") and refused_by("vllm")
