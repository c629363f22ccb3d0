"""Collective time models (comm/collective_models.py): `nccl` is eq. 9 and rings, `gloo` the
runtime's all_to_all_single with a profiled serialisation, chosen by flag or topology JSON."""

import numpy as np
import pytest

from sempar.comm.collective_models import (COLLECTIVE_MODELS, collective_model, direct_pairs,
                                           fit_sigma, serialised_a2a)
from sempar.comm.collectives import ring_pairs, ring_seconds
from sempar.comm.pipelines import PIPELINES
from sempar.comm.simulate import SimOptions, simulate
from sempar.comm.topology import Topology
from sempar.comm.topology_presets import topology_preset
from sempar.errors import InputError
from sempar.placement.placement import Placement


def _topo(sigma=None, G=4):
    rng = np.random.default_rng(1)
    a = rng.uniform(1e-4, 5e-4, (G, G))
    b = rng.uniform(1e-8, 4e-8, (G, G))
    col = None if sigma is None else {"model": "gloo", "a2a_serialisation": sigma}
    return Topology("t", np.repeat([0, 1], G // 2), a, b, col)


def _cases(G=4, n=6):
    rng = np.random.default_rng(2)
    out = []
    for _ in range(n):
        m = rng.uniform(1e4, 1e6, (G, G))
        np.fill_diagonal(m, 0)
        out.append(m)
    return out


def test_nccl_is_eq9_and_rings():
    t = topology_preset("pcie-upi8")
    m = COLLECTIVE_MODELS.get("nccl")
    b = _cases(8, 1)[0]
    assert m.a2a(t, "dispatch", b) == pytest.approx(t.a2a_seconds("dispatch", b))
    x = np.array([1e6, 3e6])
    np.testing.assert_allclose(m.collective(t, "AR", x), ring_seconds(t, "AR", x))
    np.testing.assert_allclose(m.pairs("AG", 8, 1e6), ring_pairs("AG", 8, 1e6))


def test_serialised_a2a_spans_eq9_to_one_send_after_another():
    t = _topo()
    for b in _cases():
        c = t.cost("dispatch", b)
        assert serialised_a2a(t, "dispatch", b, 0.0) == pytest.approx(t.a2a_seconds("dispatch", b))
        assert serialised_a2a(t, "dispatch", b, 1.0) == pytest.approx(c.sum(axis=1).max())
        mid = serialised_a2a(t, "dispatch", b, 0.5)
        assert t.a2a_seconds("dispatch", b) < mid < c.sum(axis=1).max()


def test_fit_sigma_recovers_the_serialisation_that_made_the_times():
    t = _topo()
    cases = _cases()
    measured = [serialised_a2a(t, "dispatch", b, 0.35) for b in cases]
    assert fit_sigma(t, cases, measured) == pytest.approx(0.35, abs=0.006)


def test_gloo_collectives_are_direct_all_to_alls():
    G = 4
    t = _topo(0.4, G)
    m = COLLECTIVE_MODELS.get("gloo")
    x = np.array([4e5, 0.0])
    one = np.full((G, G), 1e5)
    np.fill_diagonal(one, 0)
    a2a = serialised_a2a(t, "dispatch", one, 0.4)
    np.testing.assert_allclose(m.collective(t, "RS", x), [a2a, 0.0])
    np.testing.assert_allclose(m.collective(t, "AR", x), [2 * a2a, 0.0])
    # per rank the bytes of a ring (s-MoE Prelim. 1), spread over every peer
    for kind in ("AR", "RS", "AG"):
        np.testing.assert_allclose(direct_pairs(kind, G, 4e5).sum(axis=1),
                                   ring_pairs(kind, G, 4e5).sum(axis=1))


def test_model_choice_flag_then_topology_then_nccl():
    assert collective_model(_topo()).name == "nccl"
    assert collective_model(_topo(0.3)).name == "gloo"
    assert collective_model(_topo(0.3), "nccl").name == "nccl"
    with pytest.raises(InputError, match="a2a_serialisation"):
        COLLECTIVE_MODELS.get("gloo").a2a(_topo(), "dispatch", _cases(4, 1)[0])
    with pytest.raises(InputError, match="collective model"):
        collective_model(_topo(), "mpi")


def test_topology_json_keeps_collectives(tmp_path):
    t = _topo(0.25)
    p = tmp_path / "t.json"
    t.save(p)
    assert Topology.load(p).collectives == {"model": "gloo", "a2a_serialisation": 0.25}
    d = t.to_json()
    d["collectives"] = {"model": "gloo", "a2a_serialisation": 1.5}
    with pytest.raises(InputError, match="collectives"):
        Topology.from_json(d)


def test_simulate_prices_by_the_chosen_model():
    G, L, N, k, T = 4, 2, 8, 2, 256
    rng = np.random.default_rng(0)
    ex = rng.integers(0, N, (T, L, k)).astype(np.int32)
    home = np.tile((np.arange(T) * G // T)[:, None], (1, L)).astype(np.int32)
    pl = Placement(np.tile(np.arange(N), (L, 1)), N, G)
    t = _topo(0.5, G)
    pipe = PIPELINES.get("ds-moe")
    out = {}
    for name in ("nccl", "gloo"):
        out[name] = simulate(ex, home, pl, t, pipe, SimOptions(hidden=16, batch=T,
                                                                collectives=name))
    # the same bytes on the all-to-alls, more time under serialisation
    assert out["gloo"]["total"]["bytes_by_phase"]["dispatch"] == \
        out["nccl"]["total"]["bytes_by_phase"]["dispatch"]
    assert out["gloo"]["total"]["a2a_seconds_mean"] > out["nccl"]["total"]["a2a_seconds_mean"]
    # AR + AG of the T x H buffer: three direct phases of X / G per pair
    X = T * 16 * 2
    one = np.full((G, G), X / G)
    np.fill_diagonal(one, 0)
    coll = out["gloo"]["layers"][0]["seconds_by_phase"]["collectives"]
    assert coll == pytest.approx(3 * serialised_a2a(t, "dispatch", one, 0.5))


def test_profile_records_the_fitted_gloo_model():
    from sempar.testbed.fidelity import fidelity_cases, gloo_collectives

    t = _topo()
    cases = fidelity_cases(4)
    measured = [serialised_a2a(t, "dispatch", np.asarray(c["bytes"], float), 0.45) for c in cases]
    col = gloo_collectives(t, cases, measured)
    assert col["model"] == "gloo" and col["cases"] == len(cases)
    assert col["a2a_serialisation"] == pytest.approx(0.45, abs=0.006)
    assert col["median_abs_error"] < 0.01 < col["median_abs_error_eq9"]
    t.collectives = col
    assert collective_model(Topology.from_json(t.to_json())).name == "gloo"


def test_cli_collectives_flag(tmp_path):
    """`--collectives` on simulate (and serve-sim / plan, the same option): the flag beats the
    topology's model, an unknown name or gloo without a profiled serialisation is refused."""
    import json

    from typer.testing import CliRunner

    from sempar.cli import app
    from sempar.paths import dev_trace_paths

    trace = str(dev_trace_paths()[1])                               # tiny-mixtral
    topo = topology_preset("pcie-upi8")
    topo.collectives = {"model": "gloo", "a2a_serialisation": 0.5}
    path = tmp_path / "gloo.json"
    topo.save(path)

    def run(*extra):
        r = CliRunner().invoke(app, ["simulate", "--trace", trace, "--pipeline", "ds-moe",
                                     "--json", *extra])
        return r.exit_code, (json.loads(r.stdout) if r.exit_code == 0 else r.output)

    rc, by_topo = run("--topology", str(path))
    rc2, by_flag = run("--topology", str(path), "--collectives", "nccl")
    rc3, plain = run("--topology", "pcie-upi8")
    assert rc == rc2 == rc3 == 0
    assert by_flag["total"] == plain["total"]                       # nccl, as the preset
    assert by_topo["total"]["bytes"] == plain["total"]["bytes"]
    assert by_topo["total"]["a2a_seconds_mean"] > plain["total"]["a2a_seconds_mean"]
    # refusals: exit 2 and one line, through the installed entry point's error mapping
    from conftest import run_cli

    for args, msg in ((["simulate", "--trace", trace, "--collectives", "bogus"],
                       "unknown collective model 'bogus'"),
                      (["simulate", "--trace", trace, "--topology", "pcie-upi8",
                        "--collectives", "gloo"], "a2a_serialisation"),
                      (["serve-sim", "--trace", trace, "--collectives", "bogus"],
                       "unknown collective model"),
                      (["plan", "--trace", trace, "--collectives", "bogus"],
                       "unknown collective model")):
        r = run_cli(*args)
        assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_nccl_links_prices_shared_links():
    """`nccl-links`: on pcie-upi8 the 16 cross-socket pairs share one 20 GB/s UPI link, so a
    phase in which each socket-0 GPU sends b bytes to each socket-1 GPU lasts 16 b / 20 GB/s,
    not eq. 9's alpha + b / 20 GB/s; a GPU's 3 socket-local transfers share its 64 GB/s uplink;
    rings (one flow per link) and a topology without links (read from JSON) are priced as by
    `nccl`."""
    from sempar.comm.collective_models import COLLECTIVE_MODELS
    from sempar.comm.topology import Topology
    from sempar.comm.topology_presets import load_topology

    topo = load_topology("pcie-upi8")
    nccl, links = COLLECTIVE_MODELS.get("nccl"), COLLECTIVE_MODELS.get("nccl-links")
    b = 1e7
    cross = np.zeros((8, 8))
    cross[:4, 4:] = b
    eq9 = float(nccl.a2a(topo, "dispatch", cross))
    assert eq9 == pytest.approx(topo.alpha[1, 0, 4] + b / 20e9)
    assert float(links.a2a(topo, "dispatch", cross)) == pytest.approx(16 * b / 20e9)
    local = np.zeros((8, 8))
    local[0, 1:4] = b
    assert float(links.a2a(topo, "dispatch", local)) == pytest.approx(3 * b / 64e9)
    x = np.array([1e8])
    for kind in ("RS", "AG", "AR"):
        assert links.collective(topo, kind, x) == pytest.approx(nccl.collective(topo, kind, x))
    plain = Topology.from_json(topo.to_json())
    assert plain.links is None
    assert float(links.a2a(plain, "dispatch", cross)) == pytest.approx(eq9)


def test_forecast_defaults_to_links_on_presets():
    from sempar.comm.topology import Topology
    from sempar.comm.topology_presets import load_topology
    from sempar.paths import real_trace_path
    from sempar.serving.dims import model_dims
    from sempar.serving.forecast import Forecaster
    from sempar.serving.hardware import ACCELERATORS
    from sempar.trace import read_trace

    tr = read_trace(real_trace_path("deepseek-v2-lite"))
    args = (tr, model_dims("deepseek-v2-lite"))
    topo = load_topology("pcie-upi8")
    h100 = ACCELERATORS.get("h100")
    assert Forecaster(*args, topo, h100).sim["collectives"] == "nccl-links"
    assert Forecaster(*args, topo, h100, sim={"collectives": "nccl"}).sim["collectives"] == "nccl"
    assert "collectives" not in Forecaster(*args, Topology.from_json(topo.to_json()), h100).sim
