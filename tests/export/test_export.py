"""Exports: engine files round-trip through our readers; the permuted checkpoint is lossless."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sempar.export import engines
from sempar.paths import assets_dir
from sempar.placement import Placement, solve
from sempar.trace.synth import synthesize


@pytest.fixture(scope="module")
def placement():
    t = synthesize("deepseek-v2-lite", 2000, seed=3)
    return solve("eplb", t, num_devices=8, redundant=8)


def test_placement_carries_the_model_layout(placement):
    # DeepSeek-V2-Lite: 27 layers, layer 0 dense: the preset names the MoE layers 1..26
    assert placement.info["layer_ids"] == list(range(1, 27))
    assert placement.info["num_hidden_layers"] == 27
    assert placement.info["model_type"] == "deepseek_v2"


def test_sglang_rows_are_model_layers(placement, tmp_path):
    res = engines.write_engine_file(placement, "sglang", tmp_path / "s.json")
    d = json.loads(res.path.read_text())
    assert list(d) == ["physical_to_logical_map"]
    rows = np.asarray(d["physical_to_logical_map"])
    assert rows.shape == (27, 72) and rows.shape[1] % 8 == 0
    assert all(set(r.tolist()) == set(range(64)) for r in rows)
    assert np.array_equal(rows[1:], placement.phy2log)          # row = model layer number
    assert np.array_equal(rows[0], np.resize(np.arange(64), 72))  # dense layer: contiguous
    back = engines.from_sglang(d, 8, list(range(1, 27)))
    assert np.array_equal(back.phy2log, placement.phy2log)
    assert res.flags == ["--ep-size", "8", "--ep-num-redundant-experts", "8",
                         "--init-expert-location", str(res.path)]


def test_sglang_layout_from_flags_or_refused(placement, tmp_path):
    from sempar.errors import InputError

    bare = Placement(placement.phy2log, 64, 8)   # an old placement: no layout recorded
    with pytest.raises(InputError, match="layer layout"):
        engines.write_engine_file(bare, "sglang", tmp_path / "a.json")
    with pytest.raises(InputError, match="first-k-dense-replace"):
        engines.write_engine_file(bare, "sglang", tmp_path / "a.json", num_hidden_layers=27)
    res = engines.write_engine_file(bare, "sglang", tmp_path / "a.json", 27, 1)
    rows = np.asarray(json.loads(res.path.read_text())["physical_to_logical_map"])
    assert np.array_equal(rows[1:], placement.phy2log)
    with pytest.raises(InputError, match="num-hidden-layers 30"):
        engines.write_engine_file(placement, "sglang", tmp_path / "b.json", num_hidden_layers=30)
    assert not (tmp_path / "b.json").exists()
    with pytest.raises(InputError, match="only for --to sglang"):
        engines.write_engine_file(placement, "vllm", tmp_path / "v.json", num_hidden_layers=27)


@pytest.mark.parametrize("engine,name", [("sglang", "s.txt"), ("sglang", "s"),
                                         ("vllm-ascend", "a.pt"), ("vllm", "v.yaml")])
def test_refuses_names_the_engine_misreads(placement, engine, name, tmp_path):
    from sempar.errors import InputError

    with pytest.raises(InputError, match="ends in .json"):
        engines.write_engine_file(placement, engine, tmp_path / name)
    assert not (tmp_path / name).exists()


def test_refuses_models_the_engine_cannot_place(tmp_path):
    from sempar.errors import InputError

    p = solve("vanilla", synthesize("mixtral-8x7b", 300, seed=0), num_devices=4)
    with pytest.raises(InputError, match="sglang cannot place the experts of mixtral"):
        engines.write_engine_file(p, "sglang", tmp_path / "m.json")
    assert engines.write_engine_file(p, "vllm", tmp_path / "m.json").path.exists()
    p = solve("vanilla", synthesize("olmoe-1b-7b", 300, seed=0), num_devices=4)
    with pytest.raises(InputError, match="vllm cannot place the experts of olmoe"):
        engines.write_engine_file(p, "vllm", tmp_path / "o.json")
    assert not (tmp_path / "o.json").exists()


def test_vllm_and_ascend_round_trip(placement):
    v = engines.to_vllm(placement)     # PR #49572: a bare [L][P] list
    assert isinstance(v, list) and np.asarray(v).shape == (26, 72)
    assert np.array_equal(engines.from_vllm(v, 8).phy2log, placement.phy2log)
    m = engines.to_vllm_maps(placement)
    assert np.asarray(m["logical_to_physical_map"]).shape[:2] == (26, 64)
    assert np.array_equal(engines.from_vllm_maps(m, 8).phy2log, placement.phy2log)
    a = engines.to_vllm_ascend(placement)
    assert a["moe_layer_count"] == 26 and a["layer_list"][0]["device_count"] == 8
    assert len(a["layer_list"][3]["device_list"][5]["device_expert"]) == 9
    assert np.array_equal(engines.from_vllm_ascend(a).phy2log, placement.phy2log)


MODELS = assets_dir() / "models"


@pytest.mark.skipif(not (MODELS / "tiny-mixtral" / "model.safetensors").is_file(),
                    reason="tiny models not built")
@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-moe64"])
def test_permuted_checkpoint_is_lossless(name, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from sempar.export.checkpoint import permute_checkpoint

    cfg = json.loads((MODELS / name / "config.json").read_text())
    N = cfg.get("num_experts") or cfg["num_local_experts"]
    rng = np.random.default_rng(0)
    phy = np.stack([rng.permutation(N) for _ in range(cfg["num_hidden_layers"])])
    p = Placement(phy, N, 4)
    permute_checkpoint(MODELS / name, p, tmp_path / "perm")
    a = AutoModelForCausalLM.from_pretrained(MODELS / name, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "perm", dtype=torch.float32).eval()
    x = torch.from_numpy(rng.integers(2, 8192, (2, 48)))
    with torch.no_grad():
        la, lb = a(input_ids=x).logits, b(input_ids=x).logits
    assert torch.allclose(la, lb, atol=1e-5, rtol=0)
    # the experts really moved: layer 0's router rows are permuted
    ga = dict(a.named_parameters())
    gb = dict(b.named_parameters())
    key = next(k for k in ga if k.endswith("layers.0.mlp.gate.weight") or
               k.endswith("layers.0.block_sparse_moe.gate.weight"))
    assert torch.equal(gb[key], ga[key][torch.from_numpy(phy[0])])


def test_checkpoint_refuses_replicas(placement, tmp_path):
    from sempar.errors import InputError
    from sempar.export.checkpoint import permute_checkpoint

    with pytest.raises(InputError, match="replica"):
        permute_checkpoint(tmp_path, placement, tmp_path / "x")


def test_export_cli(placement, tmp_path):
    import subprocess
    import sys

    placement.save(tmp_path / "p.json")
    run = lambda *a: subprocess.run([sys.executable, "-m", "sempar.cli", "export",  # noqa: E731
                                     "--placement", str(tmp_path / "p.json"), *a],
                                    capture_output=True, text=True)
    r = run("--to", "vllm-ascend", "--out", str(tmp_path / "a.json"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "a.json").read_text())["moe_layer_count"] == 26
    flags = json.loads(r.stdout)["flags"]
    assert json.loads(flags[flags.index("--additional-config") + 1]) == {"eplb_config": {
        "expert_map_path": str(tmp_path / "a.json"), "num_redundant_experts": 8}}
    r = run("--to", "sglang", "--out", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["launch", "sglang", "with:", "--ep-size", "8",
                                "--ep-num-redundant-experts", "8", "--init-expert-location",
                                str(tmp_path / "s.json")]
    Placement(placement.phy2log, 64, 8).save(tmp_path / "p.json")   # no layout recorded
    r = run("--to", "sglang", "--out", str(tmp_path / "u.json"))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "layer layout" in r.stderr
    assert not (tmp_path / "u.json").exists()
    r = run("--to", "hf-checkpoint", "--model", "tiny-moe64", "--out", str(tmp_path / "ck"))
    assert r.returncode == 2 and "replica" in r.stderr and not (tmp_path / "ck").exists()
    r = run("--to", "trtllm", "--out", str(tmp_path / "b.json"))
    assert r.returncode == 2 and not (tmp_path / "b.json").exists()
