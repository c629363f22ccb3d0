"""Topology presets and loading (comm/topology.py defines `Topology`).

Presets, registered in `TOPOLOGIES` and built by `topology_preset(name, nodes=N)`;; figures from
docs/design.md and the papers, the rest marked as our assumption:

- `nvlink8`: 8 GPUs, 900 GB/s each way between every pair (s-MoE server A, H100 NVLink4);
  alpha 429 ns = CAMoE Fig. 3 direct NVLink write latency.
- `pcie-upi8`: two sockets of 4 GPUs behind a PCIe switch (~64 GB/s, PCIe 5.0 x16), sockets
  joined by UPI (~20 GB/s) (s-MoE server B). alpha: 1 us per PCIe hop (our assumption), 8,325 ns
  for the UPI/host detour (CAMoE Fig. 3 host path). Each socket is one node (node_of 0/1).
  Cut-through aggregation: a GPU -> switch -> GPU path costs 2 us + b / 64 GB/s.
- `a100x4-ib`: nodes of 4 A100 on NVLink (600 GB/s, ExFlow's Wilkes3 nodes), HDR200 InfiniBand
  between nodes (200 Gbit/s = 25 GB/s per GPU pair; ExFlow's cluster is dual-rail, we keep one
  rail's figure per pair). alpha 429 ns NVLink (CAMoE), 1 us per IB hop (our assumption,
  GPU -> IB switch -> GPU, cut-through). Default 2 nodes; `nodes=N` gives 4N GPUs.
- `hetero-cloud`: CAMoE's emulated cloud (appendix A.3): 4 nodes joined by tc-shaped links,
  per-direction netem delay (0.55-0.65 ms, 65-70 us between nodes 3 and 4) and tbf rate (1500
  or 10000 Mbit/s) exactly as listed; phase overheads from CAMoE §4.3's fits (dispatch alpha
  2.548 / 2.914 ms, combine 0.974 / 0.945 ms against 0.65 / 0.63 ms netem delay: we add
  2.09 ms to dispatch and 0.32 ms to combine, metadata pays the bare delay). Inside each node 2
  GPUs on the interconnects of CAMoE Fig. 3, one kind per node: direct NVLink (429 ns), 2-hop
  NVLink (858 ns), PCIe switch (2 us, our figure), host path (8,325 ns); intra-node bandwidths
  (NVLink 300 GB/s, PCIe 32 GB/s, host path 16 GB/s) are our assumptions. Default 4 nodes x 2
  GPUs = 8 devices; `nodes` may be 2..4 (the first nodes of the table).

`load_topology` takes a preset name (optionally "name:N" for N nodes) or a topology JSON file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np

from sempar.comm.topology import Topology
from sempar.errors import InputError
from sempar.registry import Registry

GB = 1e9
NVLINK_ALPHA = 429e-9           # CAMoE Fig. 3: direct NVLink write latency
HOST_ALPHA = 8325e-9            # CAMoE Fig. 3: host path through the CPU
TOPOLOGIES: Registry[Callable[[int | None], Topology]] = Registry("topology")


@TOPOLOGIES.register("nvlink8")
def _nvlink8(nodes: int | None = None) -> Topology:
    if nodes not in (None, 1):
        raise InputError(f"topology nvlink8 is one server; --nodes {nodes} does not apply")
    G = 8
    links = [(u, v, NVLINK_ALPHA, 1 / (900 * GB)) for u in range(G) for v in range(G) if u != v]
    return Topology.from_links("nvlink8", np.zeros(G, np.int32), links)


@TOPOLOGIES.register("pcie-upi8")
def _pcie_upi8(nodes: int | None = None) -> Topology:
    # nodes = the two sockets (PCIe groups): the locality level placement solvers group by
    if nodes not in (None, 2):
        raise InputError(f"topology pcie-upi8 has 2 sockets; --nodes {nodes} does not apply")
    pcie, upi = (1e-6, 1 / (64 * GB)), (HOST_ALPHA, 1 / (20 * GB))
    links = []
    for g in range(8):
        sw = f"pcie{g // 4}"
        links += [(g, sw, *pcie), (sw, g, *pcie)]
    links += [("pcie0", "pcie1", *upi), ("pcie1", "pcie0", *upi)]
    return Topology.from_links("pcie-upi8", np.repeat([0, 1], 4), links, aggregation="cut-through")


@TOPOLOGIES.register("a100x4-ib")
def _a100x4_ib(nodes: int | None = None) -> Topology:
    n = 2 if nodes is None else int(nodes)
    if n < 1:
        raise InputError(f"topology a100x4-ib: --nodes must be >= 1, got {n}")
    G = 4 * n
    node_of = np.repeat(np.arange(n), 4)
    links = [(u, v, NVLINK_ALPHA, 1 / (600 * GB)) for u in range(G) for v in range(G)
             if u != v and node_of[u] == node_of[v]]
    ib = (1e-6, 1 / (25 * GB))
    for g in range(G):
        links += [(g, "ib", *ib), ("ib", g, *ib)]
    name = "a100x4-ib" if nodes is None else f"a100x4-ib:{n}"
    return Topology.from_links(name, node_of, links, aggregation="cut-through")


# CAMoE appendix A.3: per source node, (destination node, netem delay s, tbf rate Mbit/s)
_CAMOE_TC = {0: [(1, 0.65e-3, 1500), (2, 0.56e-3, 1500), (3, 0.55e-3, 1500)],
             1: [(0, 0.645e-3, 1500), (2, 0.63e-3, 10000), (3, 0.65e-3, 10000)],
             2: [(0, 0.56e-3, 1500), (1, 0.63e-3, 10000), (3, 70e-6, 10000)],
             3: [(0, 0.565e-3, 1500), (1, 0.65e-3, 10000), (2, 65e-6, 10000)]}
# software overhead per phase on top of the link delay (CAMoE §4.3 fits minus netem delay)
_CAMOE_PHASE_ALPHA = np.array([0.0, 2.09e-3, 0.32e-3])
# intra-node GPU pair per node (CAMoE Fig. 3 kinds): (alpha s, bytes/s)
_CAMOE_INTRA = [(NVLINK_ALPHA, 300 * GB), (2 * NVLINK_ALPHA, 300 * GB), (2e-6, 32 * GB),
                (HOST_ALPHA, 16 * GB)]


@TOPOLOGIES.register("hetero-cloud")
def _hetero_cloud(nodes: int | None = None) -> Topology:
    n = 4 if nodes is None else int(nodes)
    if not 2 <= n <= 4:
        raise InputError(f"topology hetero-cloud has 2..4 nodes (CAMoE's table), got {n}")
    per = 2
    node_of = np.repeat(np.arange(n), per)
    links = []
    for m in range(n):
        a, bw = _CAMOE_INTRA[m]
        d0, d1 = m * per, m * per + 1
        links += [(d0, d1, a, 1 / bw), (d1, d0, a, 1 / bw)]
        for dst, delay, mbit in _CAMOE_TC[m]:
            if dst >= n:
                continue
            beta = 8 / (mbit * 1e6)
            for u in range(m * per, (m + 1) * per):
                for v in range(dst * per, (dst + 1) * per):
                    links.append((u, v, delay + _CAMOE_PHASE_ALPHA, beta))
    name = "hetero-cloud" if nodes is None else f"hetero-cloud:{n}"
    return Topology.from_links(name, node_of, links)


def topology_preset(name: str, nodes: int | None = None) -> Topology:
    """The preset `name` (TOPOLOGIES), with `nodes` nodes where the preset scales."""
    return TOPOLOGIES.get(name)(nodes)


def load_topology(name_or_path: str | os.PathLike, nodes: int | None = None) -> Topology:
    """A preset name (optionally "name:N" for N nodes) or a topology JSON file."""
    s = str(name_or_path)
    base, _, n = s.partition(":")
    if base in TOPOLOGIES:
        if n:
            # ASCII digits only: str.isdigit() is also true of '²' and '٨', which int() refuses
            # or reads as another number
            if not (n.isascii() and n.isdigit()) or len(n) > 6:
                raise InputError(f"topology {s!r}: the node count after ':' must be an integer "
                                 "(ASCII digits)")
            if nodes is not None and nodes != int(n):
                raise InputError(f"topology {s!r} contradicts --nodes {nodes}")
            nodes = int(n)
        if nodes is not None:
            from sempar.bounds import check_bound
            check_bound(f"topology {s!r}: nodes", nodes, 1, 1024)
        return topology_preset(base, nodes)
    p = Path(s)
    if p.suffix == ".json" or p.exists():
        topo = Topology.load(p)
        if nodes is not None and nodes != topo.num_nodes:
            raise InputError(f"{p}: topology has {topo.num_nodes} nodes, --nodes says {nodes}")
        return topo
    raise InputError(f"unknown topology {s!r}: neither a preset ({', '.join(TOPOLOGIES)}) "
                     f"nor a JSON file")
