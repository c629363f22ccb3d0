"""Conformance: sempar's engine files read by the engines' OWN loaders (tests/engine_loaders.py).

For SGLang, every path a user takes (synth / record / import sglang -> place -> export) is run
through the CLI, the printed launch flags set SGLang's runtime context, and for every EP rank
SGLang's `compute_initial_expert_location_metadata` and, for every layer SGLang's DeepSeek model
treats as sparse, `ExpertLocationDispatchInfo.init_new(layer_id)` are called. A (layer, rank)
pair conforms when the rank's physical slots hold exactly the experts the placement gives that
device at that MoE layer, and the dispatch tables send every logical expert to a slot that holds
it (the rank's own copy when it has one). The tests assert 0 mismatched pairs; two more show the
check fails on files numbered or launched wrongly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine_loaders import SGLang, package_root, vllm_ascend_eplb_utils, vllm_compute_logical_maps
from sempar.export import engines
from sempar.placement import Placement

torch = pytest.importorskip("torch")

# Published config.json values (deepseek-ai/DeepSeek-V2-Lite, deepseek-ai/DeepSeek-V3)
PUBLISHED = {
    "deepseek-v2-lite": ("DeepseekV2Config", dict(num_hidden_layers=27, first_k_dense_replace=1,
                                                  n_routed_experts=64, n_group=1, topk_group=1,
                                                  num_experts_per_tok=6, moe_layer_freq=1)),
    "deepseek-v3": ("DeepseekV3Config", dict(num_hidden_layers=61, first_k_dense_replace=3,
                                             n_routed_experts=256, n_group=8, topk_group=4,
                                             num_experts_per_tok=8, moe_layer_freq=1)),
}


def published_config(preset: str):
    import transformers

    cls, kw = PUBLISHED[preset]
    return getattr(transformers, cls)(**kw)


@pytest.fixture(scope="module")
def sglang():
    s = SGLang(package_root("sglang", "sglang"))
    yield s
    s.close()


def cli(capsys, *args: str) -> str:
    """Run `sempar <args>` in this process; its stdout."""
    from sempar.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(list(args))
    captured = capsys.readouterr()
    assert e.value.code == 0, captured.err
    return captured.out


def place_and_export(capsys, tmp_path: Path, trace: Path, ep: int, redundant: int,
                     method: str = "eplb") -> tuple[Placement, list[str]]:
    cli(capsys, "place", "--trace", str(trace), "--method", method, "--ep", str(ep),
        "--redundant", str(redundant), "--out", str(tmp_path / "p.json"))
    out = cli(capsys, "export", "--placement", str(tmp_path / "p.json"), "--to", "sglang",
              "--out", str(tmp_path / "sglang.json"), "--json")
    return Placement.load(tmp_path / "p.json"), json.loads(out)["flags"]


def sglang_mismatches(sgl: SGLang, hf_config, flags: list[str], p: Placement,
                      a2a: bool = True) -> list[tuple[int, int]]:
    """(layer_id, rank) pairs where SGLang's loaded placement is not `p` (module docstring)."""
    sgl.launch(flags, a2a=a2a)
    moe = sgl.moe_layers(hf_config)
    assert len(moe) == p.num_layers, (moe, p.num_layers)
    N, G = p.num_experts, sgl.state.parallel.ep_size
    bad = []
    for r in range(G):
        md = sgl.load(hf_config, r)
        S = md.num_local_physical_experts
        wanted_width = N + sgl.state.exec.moe.ep_num_redundant_experts  # what SGLang allocates
        for l, layer_id in enumerate(moe):
            try:
                info = sgl.dispatch.ExpertLocationDispatchInfo.init_new(layer_id)
                hosted = md.physical_to_logical_map_cpu[layer_id, r * S:(r + 1) * S].tolist()
            except IndexError:  # the file has no row for this layer: SGLang's forward fails
                bad.append((layer_id, r))
                continue
            row = p.phy2log[l]
            ok = md.num_physical_experts == wanted_width and hosted == p.slots(l)[r].tolist()
            if info.partial_logical_to_rank_dispatch_physical_map is not None:   # static
                to = info.partial_logical_to_rank_dispatch_physical_map.tolist()
                ok = ok and all(0 <= to[e] < row.size and row[to[e]] == e for e in range(N))
                ok = ok and all(to[e] // S == r for e in hosted)
            cand = info.partial_logical_to_all_physical_map.tolist()
            ok = ok and all(q < row.size and row[q] == e
                            for e in range(N) for q in cand[e] if q != -1)
            if not ok:
                bad.append((layer_id, r))
    return bad


@pytest.mark.parametrize("preset,redundant", [("deepseek-v2-lite", 0), ("deepseek-v2-lite", 8),
                                              ("deepseek-v3", 0), ("deepseek-v3", 8)])
def test_synth_place_export_sglang(sglang, capsys, tmp_path, preset, redundant):
    cli(capsys, "synth", "--preset", preset, "--tokens", "1500", "--out", str(tmp_path / "t.parquet"))
    p, flags = place_and_export(capsys, tmp_path, tmp_path / "t.parquet", 8, redundant)
    assert flags[:4] == ["--ep-size", "8", "--ep-num-redundant-experts", str(redundant)]
    cfg = published_config(preset)
    assert sglang_mismatches(sglang, cfg, flags, p) == []
    if redundant:  # without an all-to-all backend SGLang spreads tokens over the replicas
        assert sglang_mismatches(sglang, cfg, flags, p, a2a=False) == []


def sglang_dump(path: Path, L: int, moe: list[int], N: int, k: int, T: int, seed: int) -> Path:
    """An SGLang per_token dump (trace/sglang.py's layout) of a model without replicas."""
    rng = np.random.default_rng(seed)
    topk = np.full((L, T, 8), -1, np.int64)          # dense layers stay -1
    for l in moe:
        topk[l, :, :k] = np.argsort(rng.random((T, N)), axis=1)[:, :k]
    rec = dict(forward_pass_id=0, rank=0, gatherer_key="primary",
               input_ids=rng.integers(0, 1000, T).tolist(), positions=list(range(T)),
               extend_seq_lens=[T], forward_mode=1,
               topk_ids_of_layer=torch.tensor(topk, dtype=torch.int32), misc_objects=[],
               global_physical_count=torch.zeros(L, N, dtype=torch.int32))
    trivial = torch.arange(N).repeat(L, 1)
    torch.save({"records": [rec], "last_physical_to_logical_map": trivial}, path)
    return path


@pytest.mark.parametrize("preset", ["deepseek-v2-lite", "deepseek-v3"])
def test_import_sglang_place_export_sglang(sglang, capsys, tmp_path, preset):
    cfg = published_config(preset)
    moe = sglang.moe_layers(cfg)
    dump = sglang_dump(tmp_path / "expert_distribution_recorder_1700000000.0_0.pt",
                       cfg.num_hidden_layers, moe, cfg.n_routed_experts,
                       cfg.num_experts_per_tok, 400, seed=1)
    cli(capsys, "import", "sglang", str(dump), "--model", preset, "--out", str(tmp_path / "t.parquet"))
    p, flags = place_and_export(capsys, tmp_path, tmp_path / "t.parquet", 8, 8)
    assert p.info["layer_ids"] == moe
    assert sglang_mismatches(sglang, cfg, flags, p) == []


@pytest.mark.parametrize("model_type,moe_layers", [("deepseek_v2", [1, 2, 3]),
                                                   ("deepseek_v3", [2, 3, 4])])
def test_record_place_export_sglang(sglang, capsys, tmp_path, model_type, moe_layers):
    """`record` on tiny random-init DeepSeek-V2 / V3 checkpoints (their dense first layers)."""
    from hf_tiny import tiny_checkpoint

    model_dir = tiny_checkpoint(model_type, tmp_path / model_type, shard_kb=None)
    text = tmp_path / "web.txt"
    text.write_text("\n\n".join(f"request {i}: the quick brown fox jumps over the lazy dog "
                                f"and counts to {i * 7}" for i in range(12)))
    cli(capsys, "record", "--model", str(model_dir), "--text", str(text),
        "--out", str(tmp_path / "t.parquet"))
    p, flags = place_and_export(capsys, tmp_path, tmp_path / "t.parquet", 4, 4)
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    cfg.moe_layer_freq = getattr(cfg, "moe_layer_freq", 1)  # DeepSeek's config.json has it: 1
    assert p.info["layer_ids"] == sglang.moe_layers(cfg) == moe_layers
    assert sglang_mismatches(sglang, cfg, flags, p) == []


@pytest.fixture(scope="module")
def v2_lite_placement():
    from sempar.placement import solve
    from sempar.trace.synth import synthesize

    return solve("eplb", synthesize("deepseek-v2-lite", 1500, seed=2), num_devices=8, redundant=8)


def test_the_check_fails_on_rows_numbered_0_to_L_minus_1(sglang, tmp_path, v2_lite_placement):
    p = v2_lite_placement
    old = engines.ModelLayout(27, tuple(range(26)))   # the former fallback: rows 0..25
    path = tmp_path / "old.json"
    path.write_text(json.dumps(engines.to_sglang(p, old)))
    flags = ["--ep-size", "8", "--ep-num-redundant-experts", "8", "--init-expert-location", str(path)]
    bad = sglang_mismatches(sglang, published_config("deepseek-v2-lite"), flags, p)
    assert len({l for l, _ in bad}) >= 25       # 25 of 26 MoE layers get another layer's row


def test_the_check_fails_on_other_launch_flags(sglang, tmp_path, v2_lite_placement):
    res = engines.write_engine_file(v2_lite_placement, "sglang", tmp_path / "s.json")
    cfg = published_config("deepseek-v2-lite")
    flags = list(res.flags)
    flags[1] = "4"                                # --ep-size 4: SGLang accepts it silently
    assert sglang_mismatches(sglang, cfg, flags, v2_lite_placement)
    flags = list(res.flags)
    flags[3] = "0"                                # --ep-num-redundant-experts 0
    assert sglang_mismatches(sglang, cfg, flags, v2_lite_placement)


def test_sglang_places_the_models_it_should(sglang):
    """Which SGLang models can take a placement (`get_model_config_for_expert_location`)."""
    models = sglang.root / "srt" / "models"
    fmt = engines.ENGINES.get("sglang")
    for model_type in fmt.cannot_place:
        assert "get_model_config_for_expert_location" not in (models / f"{model_type}.py").read_text()
    for name in ("deepseek_v2", "qwen2_moe", "qwen3_moe", "gpt_oss"):
        assert "get_model_config_for_expert_location" in (models / f"{name}.py").read_text()


def test_vllm_places_the_models_it_should():
    """vLLM's EPLB (which PR #49572's initial map goes through) needs `MixtureOfExperts`."""
    models = package_root("vllm", "vllm") / "model_executor" / "models"
    for model_type in engines.ENGINES.get("vllm").cannot_place:
        assert "MixtureOfExperts" not in (models / f"{model_type}.py").read_text()
    for name in ("deepseek_v2", "qwen3_moe", "mixtral"):
        assert "MixtureOfExperts" in (models / f"{name}.py").read_text()


def test_vllm_compute_logical_maps(v2_lite_placement):
    compute_logical_maps = vllm_compute_logical_maps()
    p = v2_lite_placement
    log2phy, count = compute_logical_maps(torch.tensor(engines.to_vllm(p)), p.num_experts)
    maps = engines.to_vllm_maps(p)
    assert log2phy.tolist() == maps["logical_to_physical_map"]
    assert count.tolist() == maps["logical_replica_count"]


def test_vllm_ascend_expert_map(tmp_path, v2_lite_placement):
    utils = vllm_ascend_eplb_utils()
    p = v2_lite_placement
    res = engines.write_engine_file(p, "vllm-ascend", tmp_path / "a.json")
    for l in range(p.num_layers):   # vllm-ascend takes the MoE layers by position
        placed, physical = utils.expert_file_to_tensor(str(res.path), l)
        assert placed.tolist() == p.slots(l).tolist() and physical == p.num_slots
