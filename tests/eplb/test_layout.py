"""The locality layouts of a stats FILE (`sempar.eplb.layout`): the `sempar` layout (sempar's
rows-objective solver on FILE's sample), its METIS fallback, the config knob, and the
distance-scaled scenario bounds (`scenarios.caps_of`). On the shipped tiny-moe64 trace."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from eplb_cases import G, R
from sempar.eplb import source as source_mod
from sempar.eplb.config import PluginConfig
from sempar.eplb.layout import LAYOUTS, metis_home
from sempar.eplb.policy import rebalance_report
from sempar.eplb.scenarios import caps_of, distances
from sempar.eplb.source import load_source, source_from_stats
from sempar.errors import InputError
from eplb_fixtures import files, tiny_trace  # noqa: F401  (fixtures)


def _fresh(path, rows=600):
    source_mod._CACHE.clear()
    return load_source(str(path), num_layers=6, num_experts=64, num_ranks=G,
                       layout={"layout_rows": rows})


def _home_lar(home: np.ndarray, sample: np.ndarray) -> float:
    """Share of the sample's activations on the device holding most of each row's experts."""
    T, L, k = sample.shape
    hits = 0.0
    for l in range(L):
        dev = home[l][sample[:, l]]                                    # [T, k]
        cnt = np.zeros((T, G))
        np.add.at(cnt, (np.arange(T)[:, None], dev), 1)
        hits += cnt.max(axis=1).sum()
    return hits / (T * L * k)


def test_layouts_registered_once():
    assert LAYOUTS.names() == ["sempar", "metis"]
    assert LAYOUTS.get("sempar").needs_sample and not LAYOUTS.get("metis").needs_sample


def test_sempar_layout_is_local_capped_and_cached(files, monkeypatch):
    """The sempar layout: every device N / G experts, solved once per FILE version, and after
    the policy balances FILE's own load (K = 1, so LAR and balance are of the same rows) more
    local than a layout that ignores co-activation, and than METIS's."""
    src = _fresh(files["stats"])
    calls = []
    real = source_mod.sempar_home
    monkeypatch.setattr(source_mod, "sempar_home",
                        lambda *a, **k: calls.append(k["rows"]) or real(*a, **k))
    home = src.home(G, 0, "sempar")
    assert home.shape == (6, 64) and calls == [600]              # layout_rows reached it
    assert all((np.bincount(h, minlength=G) == 64 // G).all() for h in home)
    used, seconds, why = src.layouts[(G, "sempar")]
    assert (used, why) == ("sempar", None) and seconds > 0
    assert src.home(G, 0, "sempar") is home and len(calls) == 1     # cached per version
    w = np.stack([np.bincount(src.sample[:, l].ravel(), minlength=64) for l in range(6)]
                 ).astype(np.float64)
    cfg = PluginConfig(scenarios=1)
    m, rep = rebalance_report(w, 64 + R, 1, 1, G, None, src, cfg)
    assert rep.layout == "sempar" and "layout sempar" in rep.line()
    src._homes[(G, "metis")] = np.tile(np.arange(64) % G, (6, 1))   # a blind layout in its
    src.layouts[(G, "metis")] = ("metis", 0.0, None)                  # cache slot
    _, blind = rebalance_report(w, 64 + R, 1, 1, G, None, src,
                                PluginConfig(scenarios=1, layout="metis"))
    src._homes[(G, "metis")] = metis_home(src.affinity, G)
    _, metis = rebalance_report(w, 64 + R, 1, 1, G, None, src,
                                PluginConfig(scenarios=1, layout="metis"))
    assert rep.lar_after > blind.lar_after + 0.03, (rep.lar_after, blind.lar_after)
    assert rep.lar_after > metis.lar_after, (rep.lar_after, metis.lar_after)


def test_sempar_layout_falls_back_to_metis(files, monkeypatch):
    """A failing solve and a FILE without sample rows both give METIS's layout, with the reason
    in the rebalance's log line; neither raises."""
    src = _fresh(files["stats"])

    def boom(*a, **k):
        raise RuntimeError("solver broke")

    monkeypatch.setattr(source_mod, "sempar_home", boom)
    home = src.home(G, 0, "sempar")
    assert np.array_equal(home, metis_home(src.affinity, G))
    m, rep = rebalance_report(files["window"], 64 + R, 1, 1, G, None, src, PluginConfig())
    assert rep.layout == "metis (sempar fell back: RuntimeError: solver broke)"
    assert "sempar fell back" in rep.line()

    bare = source_from_stats(type("St", (), {"meta": src.meta, "sample": None,
                                             "coactivation": src.affinity})())
    home = bare.home(G, 0, "sempar")
    assert np.array_equal(home, metis_home(bare.affinity, G))
    assert bare.layouts[(G, "sempar")][2] == "FILE has no sample rows"


def test_layout_setting(files, monkeypatch):
    """SEMPAR_EPLB_LAYOUT picks the layout; a name not registered is one line, and the plug-in
    then returns the engine's default (None)."""
    assert PluginConfig.from_env({"SEMPAR_EPLB_LAYOUT": "metis"}).layout == "metis"
    assert PluginConfig().layout == "sempar"
    with pytest.raises(InputError, match="LAYOUT"):
        PluginConfig.from_env({"SEMPAR_EPLB_LAYOUT": "kahip"})
    with pytest.raises(InputError):
        PluginConfig(layout_effort=0)
    from sempar.eplb import engine

    monkeypatch.setenv("SEMPAR_EPLB", str(files["stats"]))
    monkeypatch.setenv("SEMPAR_EPLB_LAYOUT", "kahip")
    assert engine.plan(files["window"], 64 + R, 1, 1, G, None,
                       logging.getLogger("test")) is None
    assert "LAYOUT" in engine.LAST["fallback_reason"]
    monkeypatch.setenv("SEMPAR_EPLB_LAYOUT", "metis")
    source_mod._CACHE.clear()
    m = engine.plan(files["window"], 64 + R, 1, 1, G, None, logging.getLogger("test"))
    assert m is not None and engine.LAST["report"].layout == "metis"


def test_scenario_caps_rise_with_distance():
    """K = 1: the window's bound alone; distance 0: every split at max_imbalance + slack (the
    first rule); otherwise a split's bound rises by scenario_distance x its distance."""
    W = np.array([[4.0, 4.0, 0.0, 0.0], [4.0, 4.0, 0.0, 0.0], [0.0, 0.0, 4.0, 4.0]])
    assert np.allclose(distances(W), [0.0, 0.0, 1.0])
    base = PluginConfig(scenario_slack=0.01)
    assert np.allclose(caps_of(W[:1], PluginConfig(scenario_distance=3.0)), [1.02])
    assert np.allclose(caps_of(W, base), [1.02, 1.03, 1.03])
    far = caps_of(W, PluginConfig(scenario_slack=0.01, scenario_distance=0.5))
    assert np.allclose(far, [1.02, 1.03, 1.53])
