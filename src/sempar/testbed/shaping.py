"""What a testbed shapes: a topology cut to its hosts, and each host's egress rates.

- shaping (bandwidth only): on each host's egress `eth0` an htb qdisc with one class per
  destination address (a u32 filter on `ip dst`), rate = ceil = the pair's shaped bandwidth
  `scale / beta[dispatch][u][v]` bytes/s; other traffic (ARP) goes to an unshaped default class.
  This kernel has no `netem`, so **latency cannot be shaped**: a profiled alpha is the stack's own
  latency (Python + gloo + TCP + veth), not the preset's.
- `scale` maps the preset's bandwidths onto what 2 shared cores can push: the default
  1/8000 turns 64 GB/s into 8 MB/s (64 Mbit/s) and 20 GB/s into 2.5 MB/s (20 Mbit/s).
- host i has address 10.77.0.<i+1> (`host_addr`), inside the testbed's own namespaces only
  (`testbed/netns.py`).
"""

from __future__ import annotations

import numpy as np

from sempar.comm.topology import Topology, phase_index

from sempar.comm.topology_presets import load_topology
from sempar.errors import InputError

SUBNET = "10.77.0"
DEFAULT_SCALE = 1 / 8000
MAX_HOSTS = 64


def spread_devices(node_of: np.ndarray, hosts: int) -> list[int]:
    """`hosts` device ids taken round-robin over nodes (both sockets, both IB nodes, ...), sorted."""
    by_node = [list(np.flatnonzero(node_of == n)) for n in range(int(node_of.max()) + 1)]
    picked: list[int] = []
    while len(picked) < hosts:
        for devs in by_node:
            if devs and len(picked) < hosts:
                picked.append(int(devs.pop(0)))
    return sorted(picked)


def subset_topology(topo: Topology, devices: list[int]) -> Topology:
    idx = np.asarray(devices)
    _, node_of = np.unique(topo.node_of[idx], return_inverse=True)
    return Topology(f"{topo.name}[{','.join(map(str, devices))}]", node_of,
                    topo.alpha[:, idx][:, :, idx], topo.beta[:, idx][:, :, idx])


def resolve_preset(preset: str, hosts: int) -> Topology:
    """The topology the testbed shapes: a preset (pcie-upi8, a100x4-ib, ...) or a JSON FILE, cut
    to `hosts` devices spread over its nodes (a100x4-ib grows nodes to fit)."""
    if not 2 <= hosts <= MAX_HOSTS:
        raise InputError(f"--hosts must be 2..{MAX_HOSTS}, got {hosts}")
    base = str(preset).partition(":")[0]
    nodes = None
    if base == "a100x4-ib" and ":" not in str(preset) and hosts > 8:
        nodes = -(-hosts // 4)
    topo = load_topology(preset, nodes)
    if topo.num_devices < hosts:
        raise InputError(f"topology {topo.name} has {topo.num_devices} devices, --hosts {hosts} "
                         f"asks for more")
    if topo.num_devices == hosts:
        return topo
    return subset_topology(topo, spread_devices(topo.node_of, hosts))


def shaped_rates(topo: Topology, scale: float = DEFAULT_SCALE,
                 phase: str = "dispatch") -> np.ndarray:
    """float64[G, G]: bytes/s per directed pair = scale / beta (diagonal 0)."""
    if not (scale > 0 and np.isfinite(scale)):
        raise InputError(f"--scale must be a positive number, got {scale}")
    beta = topo.beta[phase_index(phase)]
    G = topo.num_devices
    off = ~np.eye(G, dtype=bool)
    if (beta[off] <= 0).any():
        raise InputError(f"topology {topo.name}: a pair has beta 0 (infinite bandwidth); "
                         f"it cannot be shaped")
    rates = np.zeros((G, G))
    rates[off] = scale / beta[off]
    if rates[off].min() < 8e3:
        raise InputError(f"--scale {scale:g} shapes a pair below 64 kbit/s; use a larger scale")
    return rates


def host_addr(i: int) -> str:
    return f"{SUBNET}.{i + 1}"


def tc_script(rates_row: np.ndarray, src: int) -> str:
    """`tc -batch` lines shaping host `src`'s egress eth0: one htb class + u32 filter per
    destination address, rate = ceil = rates_row[dst] bytes/s."""
    lines = ["qdisc add dev eth0 root handle 1: htb default 1 r2q 1",
             "class add dev eth0 parent 1: classid 1:1 htb rate 10gbit burst 256k cburst 256k"]
    for dst, rate in enumerate(rates_row):
        if dst == src:
            continue
        bits = max(int(round(rate * 8)), 8000)
        cid = 10 + dst
        lines += [f"class add dev eth0 parent 1: classid 1:{cid:x} htb rate {bits}bit "
                  f"ceil {bits}bit burst 15k cburst 15k",
                  f"qdisc add dev eth0 parent 1:{cid:x} handle {cid:x}: pfifo limit 10000",
                  f"filter add dev eth0 protocol ip parent 1: prio 1 u32 match ip dst "
                  f"{host_addr(dst)}/32 flowid 1:{cid:x}"]
    return "\n".join(lines) + "\n"
