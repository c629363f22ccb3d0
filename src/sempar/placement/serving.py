"""The serving rule: which replica serves an activation (docs/design.md, Vocabulary: LAR, remote copies).

A token homed on device g that selects logical expert e at layer l is served by the host of e
that comes first in g's order over devices, `order[g, d]` (lower first, ties to the lower id):

- **node order** (`node_order`, the default): g itself, then the other devices of g's node,
  then the rest, each group by device id: the evaluator's figures (`metrics`), the runtime's
  dispatch (`runtime.dispatch.serving_table`) and the `sempar` solver's replica step
  (`placement/sempar/replicas.py`).
- **cost order** (`cost_order`): g itself, then by a link cost from g (float[G, G], e.g. the
  topology's dispatch cost of one hidden vector), ties to the lower id: the comm simulator
  (`comm.simulate.replica_table`) and the cost-aware router (`routing.cost_bias`). It is the
  node order when the links inside every node cost the same, the links between nodes the same
  and more, and the topology's nodes are the placement's (`a100x4-ib`, `pcie-upi8` with the
  placement's nodes matching); it differs on uneven links (`hetero-cloud`, a profiled
  topology), and a single-node topology of uniform links (the bench's) ignores the placement's
  nodes: home, then the lowest id.

`table(hosts, order)` is the rule for one layer as int64[G, N]: table[g, e] the device serving
expert e for tokens homed on g; `serve` applies it to (home int[T], experts int[T, k]). A device
hosts an expert at most once (`Placement.validate`), so the device names the physical slot.
"""

from __future__ import annotations

import numpy as np

from sempar.placement.placement import Placement

CHUNK = 1 << 24         # order x hosts cells compared at once (bounds memory at large G x N)


def node_order(node_of: np.ndarray) -> np.ndarray:
    """int64[G, G]: order[g, d] = -1 for d == g, d on g's node, G + d elsewhere."""
    node_of = np.asarray(node_of)
    G = node_of.size
    order = np.where(node_of[None, :] == node_of[:, None], 0, 1) * G + np.arange(G)[None, :]
    order[np.arange(G), np.arange(G)] = -1
    return order


def cost_order(cost: np.ndarray) -> np.ndarray:
    """float64[G, G]: `cost` (non-negative, [from, to]) with the diagonal -1 (home first)."""
    order = np.array(cost, dtype=np.float64)
    np.fill_diagonal(order, -1.0)
    return order


def table(hosts: np.ndarray, order: np.ndarray) -> np.ndarray:
    """int64[G, N]: for home g and expert e the host d of e with the lowest order[g, d] (ties:
    the lower id). hosts: bool[G, N] (every expert hosted somewhere); order: [G, G] int or float."""
    hosts = np.asarray(hosts, bool)
    order = np.asarray(order)
    G, N = hosts.shape
    never = np.inf if order.dtype.kind == "f" else np.iinfo(order.dtype).max
    step = max(1, CHUNK // max(G * N, 1))
    if step >= G:
        return np.where(hosts[None, :, :], order[:, :, None], never).argmin(axis=1).astype(
            np.int64, copy=False)
    out = np.empty((G, N), np.int64)
    for a in range(0, G, step):
        out[a:a + step] = np.where(hosts[None, :, :], order[a:a + step, :, None],
                                   never).argmin(axis=1)
    return out


def serving_table(placement: Placement, layer: int, order: np.ndarray | None = None
                  ) -> np.ndarray:
    """int64[G, N]: `table` of `layer`'s hosts under `order` (default: `node_order`)."""
    if order is None:
        order = node_order(placement.node_of)
    return table(placement.hosts()[layer], order)


def serving_tables(placement: Placement, order: np.ndarray | None = None) -> np.ndarray:
    """int64[L, G, N]: `serving_table` of every layer."""
    if order is None:
        order = node_order(placement.node_of)
    return np.stack([table(h, order) for h in placement.hosts()])


def serve(tab: np.ndarray, home: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """[T, k] (tab's dtype): the serving device of each activation, tab int[G, N] one layer's
    table, home int[T] the tokens' devices, experts int[T, k] their logical experts."""
    return tab[np.asarray(home)[:, None], experts]
