"""Collective time models, registered by name in `COLLECTIVE_MODELS`: how long the collectives of
a pipeline take on a topology, for the engine that issues them.

- `nccl` (the papers' engines: NCCL, DeepEP; the default): every all-to-all phase by CAMoE
  eq. 9, all directed pairs at once, the phase lasting as long as its slowest pair; AR / RS /
  AG as rings (s-MoE §3.2, Preliminary 1): steps x the slowest ring edge
  (collectives.ring_seconds).
- `gloo` (our runtime as `sempar bench` runs it: torch.distributed's gloo on CPU). Every
  collective is one `all_to_all_single` (`runtime.dispatch.Comm`): RS and AG are direct
  all-to-alls of X / G bytes per pair, AR is RS then AG (two phases), none is a ring. gloo's
  all-to-all does not run its pairs fully at once on the namespace testbed, so a phase is
  priced per sending rank: its slowest transfer plus sigma x the sum of its other transfers,
  the phase lasting as long as its slowest sender. Only the send side: on the testbed the
  `hot` fidelity cases (every rank sends 3x to one destination) are priced well by eq. 9
  (5-13 % off), the uniform ones not (1.55-1.93x eq. 9); a receive-side term overshot the hot
  cases 2x. sigma in [0, 1] (0: eq. 9; 1: a rank's transfers one after another) is a
  measured fact of the fabric and the library: `sempar
  profile --method all_to_all_single` fits it to the all-to-all cases it times (CAMoE Alg. 1's
  way: measure, store in the topology JSON, use) and writes
  ``"collectives": {"model": "gloo", "a2a_serialisation": sigma}`` into the topology.
  The per-rank form is ours (CAMoE's eq. 9 has no such term); it reduces to eq. 9 at sigma 0.

- `nccl-links` (ours): `nccl` plus link sharing. CAMoE eq. 9 prices every directed pair as if
  its route were its own; on a topology built from links (the presets) the pairs of one
  all-to-all share links -- on `pcie-upi8` the 16 cross-socket pairs share one 20 GB/s UPI
  link and a GPU's 7 transfers its one PCIe uplink; on `a100x4-ib` a GPU's 4 remote transfers
  its one IB port -- so a phase lasts max(eq. 9, the busiest link's bytes x its seconds per
  byte) (`Topology.link_seconds`, a bandwidth bound; alphas still from eq. 9). Rings are
  priced the same way (one flow per edge: unchanged on the presets). A topology read from JSON
  (a profile) has no links, and `nccl-links` is then `nccl`. docs/serving.md ("The
  Attention-TP gap") shows what it changes.

Which model prices a forecast: `SimOptions.collectives` when given (a flag), else the
topology's `collectives.model` (a profile of gloo's all-to-all says `gloo`), else `nccl`. A
forecast for real engines uses `nccl`; one for `sempar bench` uses `gloo` with the profiled
sigma of the same testbed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from sempar.comm.collectives import ring_pairs, ring_seconds
from sempar.comm.topology import Topology
from sempar.errors import InputError
from sempar.registry import Registry

DIRECT_PHASES = {"AR": ("RS", "AG"), "RS": ("RS",), "AG": ("AG",)}


@dataclass(frozen=True)
class CollectiveModel:
    """a2a(topo, phase, bytes float64[..., G, G]) -> seconds float64[...];
    collective(topo, kind, nbytes float64[B]) -> seconds float64[B] of AR / RS / AG over
    buffers of nbytes; pairs(kind, G, nbytes) -> float64[G, G] bytes per directed pair."""

    name: str
    description: str
    a2a: Callable[[Topology, str | int, np.ndarray], np.ndarray]
    collective: Callable[[Topology, str, np.ndarray], np.ndarray]
    pairs: Callable[[str, int, float], np.ndarray]


COLLECTIVE_MODELS: Registry[CollectiveModel] = Registry("collective model")


def _eq9(topo: Topology, phase: str | int, nbytes: np.ndarray) -> np.ndarray:
    return np.asarray(topo.a2a_seconds(phase, nbytes), np.float64)


def serialised_a2a(topo: Topology, phase: str | int, nbytes: np.ndarray,
                   sigma: float) -> np.ndarray:
    """float64[...]: per sending rank, its slowest transfer + sigma x the sum of its other
    transfers (eq. 7 pair costs), max over ranks; nbytes float64[..., G, G] (src, dst)."""
    c = topo.cost(phase, nbytes)                                   # [..., G, G]
    top = c.max(axis=-1)
    return (top + sigma * (c.sum(axis=-1) - top)).max(axis=-1)


def profiled_sigma(topo: Topology) -> float:
    """The topology's measured `a2a_serialisation` (InputError when it was not profiled)."""
    s = (topo.collectives or {}).get("a2a_serialisation")
    if s is None:
        raise InputError(f"topology {topo.name}: the gloo collective model needs a measured "
                         "a2a_serialisation (sempar profile --method all_to_all_single)")
    return float(s)


def direct_pairs(kind: str, G: int, nbytes: float) -> np.ndarray:
    """float64[G, G]: bytes per pair of a direct AR / RS / AG over a buffer of nbytes (X / G to
    every peer per phase)."""
    out = np.full((G, G), len(DIRECT_PHASES[kind]) * float(nbytes) / G)
    out[np.arange(G), np.arange(G)] = 0.0
    return out


def _gloo_a2a(topo: Topology, phase: str | int, nbytes: np.ndarray) -> np.ndarray:
    return serialised_a2a(topo, phase, nbytes, profiled_sigma(topo))


def _gloo_collective(topo: Topology, kind: str, nbytes: np.ndarray) -> np.ndarray:
    G = topo.num_devices
    x = np.asarray(nbytes, np.float64)
    if G == 1:
        return np.zeros_like(x)
    per = np.broadcast_to((x / G)[..., None, None], x.shape + (G, G)).copy()
    per[..., np.arange(G), np.arange(G)] = 0.0
    one = _gloo_a2a(topo, "dispatch", per)
    return len(DIRECT_PHASES[kind]) * one * (x > 0)


COLLECTIVE_MODELS.add("nccl", CollectiveModel(
    "nccl", "the papers' engines (NCCL, DeepEP): all-to-all by CAMoE eq. 9, AR/RS/AG as rings",
    _eq9, ring_seconds, ring_pairs))
def _links_a2a(topo: Topology, phase: str | int, nbytes: np.ndarray) -> np.ndarray:
    return np.maximum(_eq9(topo, phase, nbytes), topo.link_seconds(nbytes))


def _links_collective(topo: Topology, kind: str, nbytes: np.ndarray) -> np.ndarray:
    """A ring: per step max(slowest edge, busiest shared link under the step's G flows)."""
    from sempar.comm.collectives import RING_STEPS

    G = topo.num_devices
    x = np.asarray(nbytes, np.float64)
    if G == 1:
        return np.zeros_like(x)
    step = np.zeros((G, G))
    step[np.arange(G), (np.arange(G) + 1) % G] = 1.0
    shared = RING_STEPS[kind](G) * topo.link_seconds(step) * x / G
    return np.maximum(ring_seconds(topo, kind, x), shared * (x > 0))


COLLECTIVE_MODELS.add("nccl-links", CollectiveModel(
    "nccl-links", "ours: `nccl` with link sharing -- an all-to-all phase lasts at least as long "
    "as its busiest shared link (PCIe uplink, UPI, IB port) needs for the bytes routed over it",
    _links_a2a, _links_collective, ring_pairs))
COLLECTIVE_MODELS.add("gloo", CollectiveModel(
    "gloo", "our runtime (torch gloo): every collective one all_to_all_single, AR = direct RS + "
    "AG, pairs serialised by the profiled a2a_serialisation", _gloo_a2a, _gloo_collective,
    direct_pairs))


def collective_model(topo: Topology, name: str | None = None) -> CollectiveModel:
    """`name` if given, else the topology's profiled model, else `nccl`."""
    return COLLECTIVE_MODELS.get(name or (topo.collectives or {}).get("model") or "nccl")


def fit_sigma(topo: Topology, cases: list[np.ndarray], measured: list[float],
              phase: str = "dispatch") -> float:
    """sigma in [0, 1] minimising the sum of squared log(predicted / measured) of
    `serialised_a2a` over all-to-all cases (byte matrices float64[G, G], seconds measured)."""
    m = np.log(np.asarray(measured, np.float64))
    grid = np.linspace(0.0, 1.0, 201)
    err = [float(np.sum((np.log(np.array([serialised_a2a(topo, phase, c, s) for c in cases])) - m)
                        ** 2)) for s in grid]
    return float(grid[int(np.argmin(err))])
