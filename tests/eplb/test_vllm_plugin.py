"""The plug-in in vLLM 0.33.0, through vLLM's own code: its plug-in loader
(`load_general_plugins`, VLLM_PLUGINS=sempar), its async EPLB worker's rebalance entry
(`async_worker.run_rebalance_experts`, the same `policy.rebalance_experts` call as the
synchronous `EplbState.rearrange`), its `compute_logical_maps`. Skipped without vLLM."""

from __future__ import annotations

import logging
from types import SimpleNamespace as NS

import numpy as np
import pytest

from eplb_cases import G, R, broken_files
from engines import env, sempar_entry_point
from eplb_fixtures import files, tiny_trace  # noqa: F401  (fixtures)

pytest.importorskip("vllm", reason="vLLM is not installed (the `engines` extra)")
torch = pytest.importorskip("torch")


@pytest.fixture
def vllm_policies():
    """vLLM's policy table and plug-in loader, reset before and restored after."""
    from engine_loaders import compile_function, package_root

    root = package_root("vllm", "vllm")
    try:
        import vllm.plugins as plugins
        from vllm.distributed.eplb import policy as policies
        from vllm.distributed.eplb.eplb_utils import device_stream
    except Exception as err:  # noqa: BLE001 - vLLM that does not import on this machine
        pytest.skip(f"vLLM's EPLB modules do not import here: {err}")
    from sempar.eplb import engine

    # async_worker.py imports vLLM's distributed runtime at module level (CUDA-only deps):
    # its rebalance entry is compiled from the installed source, as engine_loaders does
    run = compile_function(root / "distributed" / "eplb" / "async_worker.py",
                           "run_rebalance_experts", {"torch": torch, "device_stream": device_stream})

    saved = dict(policies.EPLB_POLICIES)
    plugins.plugins_loaded = False
    engine.LAST.update(fallback_reason=None, report=None)
    yield NS(policies=policies, plugins=plugins, worker=NS(run_rebalance_experts=run),
             default=policies.DefaultEplbPolicy)
    policies.EPLB_POLICIES.clear()
    policies.EPLB_POLICIES.update(saved)
    plugins.plugins_loaded = False


def _load(v, path, **extra):
    with sempar_entry_point("vllm.general_plugins"), env(VLLM_PLUGINS="sempar",
                                                         SEMPAR_EPLB=path, **extra):
        v.plugins.load_general_plugins()
    return v.policies.EPLB_POLICIES["default"]


def _rebalance(v, w, old, **extra):
    """vLLM's async worker's entry, on CPU tensors, as the engine calls it."""
    P = old.shape[1]
    state = NS(policy=v.policies.EPLB_POLICIES["default"])
    model = NS(eplb_stats=NS(global_expert_load_window=torch.tensor(w), num_replicas=P,
                             num_groups=1, num_nodes=1, num_gpus=G))
    with env(**extra):
        return v.worker.run_rebalance_experts(model, state, torch.tensor(old), None)


def _start(v, w, P):
    return v.default.rebalance_experts(torch.tensor(w), P, 1, 1, G, None)


@pytest.mark.parametrize("kind", ["stats", "placement"])
def test_loader_installs_policy_and_map_is_sempars(vllm_policies, files, kind):
    v, w = vllm_policies, files["window"]
    L, N = w.shape
    P = N + R
    pol = _load(v, files[kind])
    assert pol is not v.default and issubclass(pol, v.default)
    old = _start(v, w, P)
    got = _rebalance(v, w, old.numpy(), SEMPAR_EPLB=str(files[kind]))
    from sempar.eplb.config import PluginConfig
    from sempar.eplb.policy import rebalance
    from sempar.eplb.source import load_source

    src = load_source(str(files[kind]), num_layers=L, num_experts=N, num_ranks=G)
    want = rebalance(w, P, 1, 1, G, old.numpy(), src, PluginConfig(engine="vllm"))
    assert np.array_equal(got.numpy(), want)
    from sempar.eplb import engine

    rep = engine.LAST["report"]                            # the last rebalance's figures
    assert rep is not None and rep.moves == int((want != old.numpy()).sum())
    assert engine.LAST["fallback_reason"] is None
    assert not torch.equal(got, v.default.rebalance_experts(torch.tensor(w), P, 1, 1, G, old))
    from engine_loaders import vllm_compute_logical_maps

    log2phy, count = vllm_compute_logical_maps()(got, N)
    assert int(count.min()) >= 1 and int(count.sum()) == L * P
    for l in range(L):
        for e in range(N):
            slots = log2phy[l, e][log2phy[l, e] >= 0]
            assert (got[l, slots] == e).all()


def test_every_broken_file_gives_vllms_default(vllm_policies, files, tmp_path, caplog):
    v, w = vllm_policies, files["window"]
    N = w.shape[1]
    P = N + R
    _load(v, files["stats"])
    old = _start(v, w, P)
    want = v.default.rebalance_experts(torch.tensor(w), P, 1, 1, G, old)
    for name, (path, extra) in broken_files(files, tmp_path).items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vllm"):
            got = _rebalance(v, w, old.numpy(), SEMPAR_EPLB=str(path), **extra)
        assert torch.equal(got, want), name
        lines = [r for r in caplog.records if r.name == "vllm.sempar_eplb"]
        assert len(lines) == 1 and "default policy" in lines[0].getMessage(), name


def test_unset_leaves_vllm_unchanged(vllm_policies, files):
    v, w = vllm_policies, files["window"]
    N = w.shape[1]
    with sempar_entry_point("vllm.general_plugins"), env(VLLM_PLUGINS="sempar", SEMPAR_EPLB=None):
        v.plugins.load_general_plugins()
    assert v.policies.EPLB_POLICIES["default"] is v.default
    old = _start(v, w, N + R)
    a = _rebalance(v, w, old.numpy())
    b = v.default.rebalance_experts(torch.tensor(w), N + R, 1, 1, G, old)
    assert a.dtype == b.dtype and a.numpy().tobytes() == b.numpy().tobytes()
