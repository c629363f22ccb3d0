"""The plug-in in SGLang 0.5.23, through SGLang's own code: its plug-in loader
(`sglang.srt.plugins.load_plugins`, SGLANG_PLUGINS=sempar, which applies the hooks), its
rebalance entry `ExpertLocationMetadata.init_by_eplb` (what `EPLBManager.rebalance` calls) and
the metadata constructor it ends in. SGLang's runtime context is the stub of
tests/engine_loaders.py (a launch with --ep-size 4 --ep-num-redundant-experts 4). Skipped
without SGLang."""

from __future__ import annotations

import importlib
import logging
from types import SimpleNamespace as NS

import numpy as np
import pytest

from eplb_cases import G, R, broken_files
from engines import env, sempar_entry_point
from eplb_fixtures import files, tiny_trace  # noqa: F401  (fixtures)

torch = pytest.importorskip("torch")


@pytest.fixture
def sglang(files):
    from engine_loaders import SGLang, package_root

    root = package_root("sglang", "sglang")
    h = SGLang(root)
    try:
        h.launch(["--ep-size", str(G), "--ep-num-redundant-experts", str(R),
                  "--init-expert-location", "trivial"], a2a=False)
        h.state.exec.moe.eplb_algorithm = "auto"
        L, N = files["window"].shape
        loc = h.location
        loc.ModelConfigForExpertLocation.from_model_config = staticmethod(
            lambda mc: loc.ModelConfigForExpertLocation(num_layers=L, num_logical_experts=N))
        plugins = importlib.import_module("sglang.srt.plugins")
        algorithms = importlib.import_module("sglang.srt.eplb.eplb_algorithms")
        yield NS(h=h, loc=loc, plugins=plugins, algorithms=algorithms,
                 original=algorithms.rebalance_experts)
    finally:
        h.close()


def _load(s, path):
    with sempar_entry_point("sglang.srt.plugins", patch_module=s.plugins), \
            env(SGLANG_PLUGINS="sempar", SEMPAR_EPLB=path):
        s.plugins.load_plugins()


def _rebalance(s, w, **extra):
    """`init_by_eplb` on CPU tensors, as `EPLBManager.rebalance` calls it."""
    with env(**extra):
        return s.loc.ExpertLocationMetadata.init_by_eplb(NS(hf_config=None), torch.tensor(w))


def _serve_default(s, w):
    """The engine's own map is serving (the old map the plug-in reads)."""
    with env(SEMPAR_EPLB=None):
        md = _rebalance(s, w)
    s.h.state.resources.expert_location_metadata = md
    return md


@pytest.mark.parametrize("kind", ["stats", "placement"])
def test_loader_hooks_rebalance_and_map_is_sempars(sglang, files, kind):
    s, w = sglang, files["window"]
    L, N = w.shape
    P = N + R
    _load(s, files[kind])
    assert s.algorithms.rebalance_experts is not s.original
    old = _serve_default(s, w)
    md = _rebalance(s, w, SEMPAR_EPLB=str(files[kind]))
    assert isinstance(md, s.loc.ExpertLocationMetadata)   # SGLang's own constructor took it
    from sempar.eplb.config import PluginConfig
    from sempar.eplb.policy import rebalance
    from sempar.eplb.source import load_source

    src = load_source(str(files[kind]), num_layers=L, num_experts=N, num_ranks=G)
    want = rebalance(w, P, 1, 1, G, old.physical_to_logical_map_cpu.numpy(), src,
                     PluginConfig(engine="sglang"))
    got = md.physical_to_logical_map_cpu.numpy()
    assert np.array_equal(got, want)
    assert not np.array_equal(got, old.physical_to_logical_map_cpu.numpy())
    l2p = md.logical_to_all_physical_map_cpu.numpy()
    for l in range(L):
        for e in range(N):
            slots = l2p[l, e][l2p[l, e] >= 0]
            assert slots.size >= 1 and (got[l, slots] == e).all()
            assert np.array_equal(slots, np.flatnonzero(got[l] == e))
    assert int(md.logical_to_all_physical_map_num_valid.sum()) == L * P


def test_every_broken_file_gives_sglangs_default(sglang, files, tmp_path, caplog):
    s, w = sglang, files["window"]
    _load(s, files["stats"])
    want = _serve_default(s, w)
    for name, (path, extra) in broken_files(files, tmp_path).items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="sglang"):
            got = _rebalance(s, w, SEMPAR_EPLB=str(path), **extra)
        for f in ("physical_to_logical_map", "logical_to_all_physical_map",
                  "logical_to_all_physical_map_num_valid"):
            assert torch.equal(getattr(got, f), getattr(want, f)), (name, f)
        lines = [r for r in caplog.records if r.name == "sglang.srt.eplb.sempar"]
        assert len(lines) == 1 and "default policy" in lines[0].getMessage(), name


def test_unset_leaves_sglang_unchanged(sglang, files):
    s, w = sglang, files["window"]
    with sempar_entry_point("sglang.srt.plugins", patch_module=s.plugins), \
            env(SGLANG_PLUGINS="sempar", SEMPAR_EPLB=None):
        s.plugins.load_plugins()
    assert s.algorithms.rebalance_experts is s.original
    a = _rebalance(s, w)
    b = s.original(tokens_per_expert=torch.tensor(w)[None], num_physical_experts=w.shape[1] + R,
                   num_local_physical_experts=(w.shape[1] + R) // G, num_groups=None,
                   num_nodes=1, algorithm=s.algorithms.EplbAlgorithm.deepseek)
    assert a.physical_to_logical_map.numpy().tobytes() == b[0].numpy().tobytes()


def test_elastic_ep_passes_through(sglang, files):
    """With elastic EP (`elasticity_aware`), only SGLang knows the live ranks: the hook calls
    SGLang's own algorithm."""
    s, w = sglang, files["window"]
    _load(s, files["stats"])
    seen = []

    def original(**kw):
        seen.append(kw["algorithm"])
        return "sglang's"
    from sempar.eplb.sglang_plugin import around_rebalance

    algo = s.algorithms.EplbAlgorithm.elasticity_aware
    with env(SEMPAR_EPLB=str(files["stats"])):
        got = around_rebalance(original, torch.tensor(w)[None], w.shape[1] + R,
                               (w.shape[1] + R) // G, None, 1, algo)
    assert got == "sglang's" and seen == [algo]
