"""Command-line inputs of `serve-sim` and `plan` turned into a Forecaster (one line per bad
input, InputError)."""

from __future__ import annotations

from pathlib import Path

from sempar.comm.topology import Topology
from sempar.comm.topology_presets import load_topology
from sempar.errors import InputError
from sempar.serving.metrics import SLO_KEYS


def topology_for(name: str, ep: int | None, nodes: int | None = None) -> Topology:
    """The topology `name` (preset or JSON) with `ep` devices: a scalable preset gets the nodes
    that give `ep` devices; otherwise its device count must equal `ep`."""
    topo = load_topology(name, nodes)
    if ep is None or ep == topo.num_devices:
        return topo
    if ep < 1:
        raise InputError(f"--ep: {ep} is not a positive integer")
    per_node = topo.num_devices // max(1, topo.num_nodes)
    if nodes is None and ep % per_node == 0:
        try:
            scaled = load_topology(name, ep // per_node)
        except InputError:
            scaled = None
        if scaled is not None and scaled.num_devices == ep:
            return scaled
    raise InputError(f"--ep {ep}: topology {topo.name} has {topo.num_devices} devices")


def parse_floats(s: str | None, what: str) -> list[float] | None:
    """Comma-separated positive finite numbers (None for None); the options' own bounds are
    checked when the command line is parsed (commands/_options.py)."""
    if s is None:
        return None
    from sempar.bounds import Bounds, NumberList

    return NumberList(what, Bounds(0, None, lo_open=True)).parse(s)


def parse_slo(s: str | None) -> dict:
    """"e2e=10,ttft=0.5" -> {"e2e": 10.0, "ttft": 0.5} (seconds, each finite in (0, a week])."""
    from sempar.bounds import SECONDS_MAX, check_bound

    out: dict = {}
    for part in (s or "").split(","):
        if not part.strip():
            continue
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in SLO_KEYS:
            raise InputError(f"--slo: {key!r} is not one of {', '.join(SLO_KEYS)}")
        try:
            out[key] = float(val)
        except ValueError:
            raise InputError(f"--slo: {part!r} is not KEY=SECONDS") from None
        check_bound(f"--slo {key}", out[key], 0, SECONDS_MAX, lo_open=True)
    return out


def accelerator_for(name: str, profile: Path | None = None):
    """The accelerator `name` with the profile at `profile` attached (`--accelerator-profile`);
    without one the forecast uses the shipped profile of `name`, if any (accel_profile.py)."""
    from dataclasses import replace

    from sempar.serving.hardware import ACCELERATORS

    acc = ACCELERATORS.get(name)
    if profile is None:
        return acc
    from sempar.serving.accel_profile import load_profile

    return replace(acc, profile=load_profile(profile))


def forecaster(trace: Path, preset: str | None, topology: str, accelerator: str, ep: int | None,
               nodes: int | None = None, budget: int = 2048, max_running: int = 128, seed: int = 0,
               collectives: str | None = None, profile: Path | None = None):
    """The Forecaster of a verb's options; `collectives` names the collective model (None: the
    topology's, comm/collective_models.py); `profile` an accelerator profile file."""
    from sempar.serving.dims import model_dims
    from sempar.serving.forecast import Forecaster
    from sempar.solve_options import SolveOptions
    from sempar.trace import read_trace

    acc = accelerator_for(accelerator, profile)
    topo = topology_for(topology, ep, nodes)
    tr = read_trace(trace)
    dims = model_dims(preset or tr.meta.model)
    return Forecaster(tr, dims, topo, acc, budget=budget, max_running=max_running,
                      options=SolveOptions(seed=seed),
                      sim={"collectives": collectives} if collectives else None)
