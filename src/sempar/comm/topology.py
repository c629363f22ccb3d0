"""Topology: devices, nodes and an alpha-beta cost per directed device pair and phase (CAMoE §3).

A transfer of `b > 0` bytes from device u to device v in phase p costs
``alpha[p, u, v] + beta[p, u, v] * b`` seconds (CAMoE eq. 7 with end-to-end parameters); nothing
is sent, nothing is paid. The all-to-all time of one phase is the max of that cost over the
directed pairs (CAMoE eq. 9). Phases: `metadata` (token counts / expert ids), `dispatch`
(activations + routing weights), `combine` (expert outputs back); collectives that are not
all-to-all (ring all-reduce, reduce-scatter, all-gather) use the `dispatch` parameters.

`Topology.from_links` builds the matrices from directed links between vertices: ints
``0..G-1`` are devices, any other name (str) is a switch, NIC or host. Each device pair without
an explicit path takes the cheapest path (per phase, cost alpha + beta * 1 MiB); hop parameters
are aggregated **store-and-forward** (sum of alphas, sum of betas) or **cut-through** (sum of
alphas, max of betas), as CAMoE §3 ("Multi-hop & asymmetry") says.

`collectives` (optional): what a profile measured about the library issuing the collectives,
e.g. {"model": "gloo", "a2a_serialisation": 0.4} (comm/collective_models.py); absent for presets.

Presets (`nvlink8`, `pcie-upi8`, `a100x4-ib`, `hetero-cloud`) and `load_topology` (a preset name or a
JSON file) live in comm/topology_presets.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from sempar.atomic import write_text_atomic
from sempar.errors import InputError

PHASES = ("metadata", "dispatch", "combine")
AGGREGATIONS = ("store-and-forward", "cut-through")
FORMAT_VERSION = 1
REF_BYTES = 1 << 20     # message size used to pick the cheapest multi-hop path


def phase_index(phase: str | int) -> int:
    if isinstance(phase, (int, np.integer)) and 0 <= int(phase) < len(PHASES):
        return int(phase)
    try:
        return PHASES.index(phase)
    except ValueError:
        raise InputError(f"unknown phase {phase!r}; choose one of: {', '.join(PHASES)}") from None


@dataclass
class Topology:
    """node_of: int32[G]; alpha, beta: float64[3, G, G] (s per message, s per byte; diagonal 0);
    collectives: {"model": name, "a2a_serialisation": float in [0, 1], ...} or None."""

    name: str
    node_of: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    collectives: dict | None = None
    # Shared links (set by `from_links`, not written to JSON): (beta float64[E] seconds per byte
    # of each directed link in the dispatch phase, use bool[E, G, G]: whether the route of
    # device pair (u, v) crosses link e). eq. 9 prices every pair as if it had its route to
    # itself; `link_seconds` is the time the busiest shared link needs for all the bytes
    # routed over it (the `nccl-links` collective model, comm/collective_models.py).
    links: tuple[np.ndarray, np.ndarray] | None = None

    def __post_init__(self) -> None:
        self.node_of = np.asarray(self.node_of, dtype=np.int32)
        self.alpha = np.asarray(self.alpha, dtype=np.float64)
        self.beta = np.asarray(self.beta, dtype=np.float64)
        if self.alpha.ndim == 2:            # one matrix for every phase
            self.alpha = np.repeat(self.alpha[None], len(PHASES), axis=0)
        if self.beta.ndim == 2:
            self.beta = np.repeat(self.beta[None], len(PHASES), axis=0)
        self.validate()

    @property
    def num_devices(self) -> int:
        return int(self.node_of.size)

    @property
    def num_nodes(self) -> int:
        return int(self.node_of.max()) + 1 if self.node_of.size else 0

    def validate(self) -> "Topology":
        G = self.num_devices
        if self.node_of.ndim != 1 or G < 1:
            raise InputError(f"topology {self.name}: node_of must be a non-empty list of node ids")
        for key in ("alpha", "beta"):
            m = getattr(self, key)
            if m.shape != (len(PHASES), G, G):
                raise InputError(f"topology {self.name}: {key} has shape {list(m.shape)}, "
                                 f"expected [{len(PHASES)}, {G}, {G}] (phases x devices x devices)")
            if not np.isfinite(m).all():
                raise InputError(f"topology {self.name}: {key} holds a non-finite value")
            if (m < 0).any():
                p, u, v = np.argwhere(m < 0)[0]
                raise InputError(f"topology {self.name}: {key}[{PHASES[p]}][{u}][{v}] = "
                                 f"{m[p, u, v]} is negative")
        used = np.unique(self.node_of)
        if used[0] < 0 or used.size != used.max() + 1:
            raise InputError(f"topology {self.name}: node ids must be 0..n-1 with none skipped, "
                             f"got {used.tolist()}")
        c = self.collectives
        if c is not None:
            s = c.get("a2a_serialisation") if isinstance(c, dict) else None
            if (not isinstance(c, dict) or not isinstance(c.get("model"), str)
                    or (s is not None and not (isinstance(s, (int, float)) and 0 <= s <= 1))):
                raise InputError(f"topology {self.name}: collectives must be {{\"model\": name, "
                                 "\"a2a_serialisation\": a number in [0, 1]}")
        eye = np.eye(G, dtype=bool)
        self.alpha[:, eye] = 0.0
        self.beta[:, eye] = 0.0
        return self

    # ---- the alpha-beta model -------------------------------------------------------------
    def cost(self, phase: str | int, nbytes: np.ndarray) -> np.ndarray:
        """float64[..., G, G]: alpha + beta * bytes where bytes > 0, else 0 (CAMoE eq. 7).

        nbytes: [G, G] or a stack [..., G, G] of byte matrices (e.g. one per batch)."""
        p = phase_index(phase)
        b = np.asarray(nbytes, dtype=np.float64)
        if b.shape[-2:] != (self.num_devices, self.num_devices):
            raise InputError(f"byte matrix shape {list(b.shape)} does not end in "
                             f"[{self.num_devices}, {self.num_devices}]")
        return np.where(b > 0, self.alpha[p] + self.beta[p] * b, 0.0)

    def a2a_seconds(self, phase: str | int, nbytes: np.ndarray) -> float | np.ndarray:
        """CAMoE eq. 9 for one phase: max over directed pairs of `cost` (one per leading index)."""
        c = self.cost(phase, nbytes)
        m = c.reshape(c.shape[:-2] + (-1,)).max(axis=-1)
        return float(m) if m.ndim == 0 else m

    def link_seconds(self, nbytes: np.ndarray) -> np.ndarray:
        """float64[...]: for byte matrices nbytes float64[..., G, G] (src, dst) sent at once, the
        busiest link's bytes x its seconds per byte (0 without `links`): the bandwidth bound of
        flows that share a link (a PCIe uplink, a UPI or an IB port), which eq. 9 leaves out."""
        b = np.asarray(nbytes, dtype=np.float64)
        if self.links is None:
            return np.zeros(b.shape[:-2])
        beta, use = self.links
        G = self.num_devices
        load = b.reshape(b.shape[:-2] + (G * G,)) @ use.reshape(len(beta), G * G).T.astype(np.float64)
        return (load * beta).max(axis=-1)

    def pair_cost(self, phase: str | int, nbytes: float) -> np.ndarray:
        """float64[G, G]: cost of `nbytes` on every pair (diagonal 0), nearest-replica distance."""
        return self.alpha[phase_index(phase)] + self.beta[phase_index(phase)] * float(nbytes)

    # ---- I/O ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d = {"format_version": FORMAT_VERSION, "kind": "topology", "name": self.name,
             "phases": list(PHASES), "node_of": self.node_of.tolist(),
             "alpha": {p: self.alpha[i].tolist() for i, p in enumerate(PHASES)},
             "beta": {p: self.beta[i].tolist() for i, p in enumerate(PHASES)}}
        if self.collectives is not None:
            d["collectives"] = self.collectives
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Topology":
        """Accepts `to_json`'s form, or a link list: {"name", "node_of", "links": [{"src", "dst",
        "alpha", "beta"} (numbers or {phase: number})], "paths"?, "aggregation"?, "symmetric"?}."""
        if not isinstance(d, dict):
            raise InputError("topology JSON must be an object")
        version = d.get("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise InputError(f"topology format_version {version!r} is not supported "
                             f"(expected {FORMAT_VERSION})")
        for key in ("name", "node_of"):
            if key not in d:
                raise InputError(f"topology JSON: missing field {key!r}")
        _check_node_of(d["node_of"])
        _check_types(d)
        if "links" in d:
            links = []
            for i, ln in enumerate(d["links"]):
                missing = [k for k in ("src", "dst", "alpha", "beta") if k not in ln]
                if missing:
                    raise InputError(f"topology JSON: links[{i}] lacks '{missing[0]}'")
                links.append((_vertex(ln["src"], f"links[{i}].src"),
                              _vertex(ln["dst"], f"links[{i}].dst"),
                              _cost(ln["alpha"], f"links[{i}].alpha"),
                              _cost(ln["beta"], f"links[{i}].beta")))
            paths = {}
            for i, p in enumerate(d.get("paths", [])):
                missing = [k for k in ("src", "dst", "via") if k not in p]
                if missing:
                    raise InputError(f"topology JSON: paths[{i}] lacks '{missing[0]}' "
                                     "(needs src, dst, via)")
                if not isinstance(p["via"], list):
                    raise InputError(f"topology JSON: paths[{i}].via is not a list of vertices")
                paths[(_vertex(p["src"], f"paths[{i}].src"), _vertex(p["dst"], f"paths[{i}].dst"))] = \
                    [_vertex(x, f"paths[{i}].via") for x in p["via"]]
            t = cls.from_links(d["name"], d["node_of"], links, paths=paths,
                               aggregation=d.get("aggregation", "store-and-forward"),
                               symmetric=d.get("symmetric", False))
            t.collectives = d.get("collectives")
            return t.validate()
        for key in ("alpha", "beta"):
            if key not in d:
                raise InputError(f"topology JSON: missing field {key!r} (or give 'links')")

        def stack(m: Any, key: str) -> np.ndarray:
            if isinstance(m, dict):
                missing = [p for p in PHASES if p not in m]
                if missing:
                    raise InputError(f"topology JSON: {key} lacks phase {missing[0]!r}")
                m = [m[p] for p in PHASES]
            try:
                return np.asarray(m, dtype=np.float64)
            except (TypeError, ValueError):
                raise InputError(f"topology JSON: {key} is not a numeric matrix") from None

        return cls(d["name"], np.asarray(d["node_of"]), stack(d["alpha"], "alpha"),
                   stack(d["beta"], "beta"), d.get("collectives"))

    def save(self, path: str | os.PathLike) -> None:
        write_text_atomic(path, json.dumps(self.to_json()) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Topology":
        from sempar.safe_json import read_json_object

        return cls.from_json(read_json_object(path, "topology file"))

    # ---- links -> matrices -----------------------------------------------------------------
    @classmethod
    def from_links(cls, name: str, node_of: Sequence[int], links: Iterable[tuple],
                   paths: dict[tuple[int, int], Sequence] | None = None,
                   aggregation: str = "store-and-forward", symmetric: bool = False) -> "Topology":
        """Build a topology from directed links (src, dst, alpha, beta).

        alpha/beta: a number (every phase) or three numbers (metadata, dispatch, combine).
        Vertices: ints 0..G-1 are devices, other names (str) switches / NICs / hosts.
        paths: {(u, v): [u, w1, ..., v]} fixes the route of a device pair; the others take the
        cheapest route (cost alpha + beta * 1 MiB, per phase). Hop parameters along a route are
        aggregated store-and-forward (sum alpha, sum beta) or cut-through (sum alpha, max beta).
        symmetric: add the reverse of every link with the same parameters.
        """
        from scipy.sparse import csr_array
        from scipy.sparse.csgraph import shortest_path

        if aggregation not in AGGREGATIONS:
            raise InputError(f"unknown aggregation {aggregation!r}; choose one of: "
                             f"{', '.join(AGGREGATIONS)}")
        node_of = np.asarray(node_of, dtype=np.int32)
        G = node_of.size
        verts: dict[Any, int] = {g: g for g in range(G)}
        hop: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

        def vid(x: Any) -> int:
            if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
                if not 0 <= int(x) < G:
                    raise InputError(f"topology {name}: link endpoint {x} is not a device 0..{G - 1}")
                return int(x)
            return verts.setdefault(str(x), len(verts))

        def three(x: Any, what: str) -> np.ndarray:
            a = np.asarray(x, dtype=np.float64).reshape(-1)
            if a.size == 1:
                a = np.repeat(a, len(PHASES))
            if a.size != len(PHASES) or not np.isfinite(a).all() or (a < 0).any():
                raise InputError(f"topology {name}: link {what} must be one or {len(PHASES)} "
                                 f"non-negative numbers, got {x!r}")
            return a

        for ln in links:
            if len(ln) != 4:
                raise InputError(f"topology {name}: a link is (src, dst, alpha, beta), got {ln!r}")
            s, t, a, b = ln
            u, v = vid(s), vid(t)
            pair = (three(a, "alpha"), three(b, "beta"))
            hop[(u, v)] = pair
            if symmetric:
                hop.setdefault((v, u), pair)
        V = len(verts)
        A = np.zeros((len(PHASES), V, V))
        B = np.zeros((len(PHASES), V, V))
        has = np.zeros((V, V), bool)
        for (u, v), (a, b) in hop.items():
            A[:, u, v], B[:, u, v], has[u, v] = a, b, True
        alpha = np.zeros((len(PHASES), G, G))
        beta = np.zeros((len(PHASES), G, G))
        edges = {h: i for i, h in enumerate(hop)}
        use = np.zeros((len(edges), G, G), bool)
        fixed = {(vid(u), vid(v)): [vid(x) for x in via] for (u, v), via in (paths or {}).items()}
        src, dst = np.nonzero(has)
        for p in range(len(PHASES)):
            # A sparse graph's stored entries are its edges, zero-cost ones included; a dense
            # matrix would take any weight within 1e-8 of 0 for "no link" (numpy's masked_values
            # tolerance), refusing a 5 ns latency-only link as "no route".
            w = csr_array((A[p][src, dst] + B[p][src, dst] * REF_BYTES, (src, dst)), shape=(V, V))
            _, pred = shortest_path(w, directed=True, return_predecessors=True, indices=range(G))
            for u in range(G):
                for v in range(G):
                    if u == v:
                        continue
                    route = fixed.get((u, v))
                    if route is None:
                        if pred[u, v] < 0:
                            raise InputError(f"topology {name}: no route from device {u} to {v}")
                        route = [v]
                        while route[-1] != u:
                            route.append(int(pred[u, route[-1]]))
                        route.reverse()
                    elif route[0] != u or route[-1] != v:
                        raise InputError(f"topology {name}: path for ({u}, {v}) must start at "
                                         f"{u} and end at {v}")
                    hops = list(zip(route[:-1], route[1:]))
                    if not all(max(h) < V and has[h] for h in hops):
                        raise InputError(f"topology {name}: path ({u}, {v}) uses a missing link")
                    ha = np.array([A[p][h] for h in hops])
                    hb = np.array([B[p][h] for h in hops])
                    alpha[p, u, v] = ha.sum()
                    beta[p, u, v] = hb.sum() if aggregation == "store-and-forward" else hb.max()
                    if p == PHASES.index("dispatch"):
                        use[[edges[h] for h in hops], u, v] = True
        link_beta = np.array([b[PHASES.index("dispatch")] for _, b in hop.values()])
        return cls(name, node_of, alpha, beta, links=(link_beta, use))


def _check_types(d: dict[str, Any]) -> None:
    """The JSON types of a topology's top-level fields (wrong ones: one line, never a
    traceback nor a silently different topology)."""
    if not isinstance(d["name"], str) or not d["name"].isprintable() or len(d["name"]) > 200:
        raise InputError(f"topology JSON: name {str(d['name'])[:40]!r} is not a printable "
                         "name of at most 200 characters")
    for key, typ, what in (("links", list, "a list"), ("paths", list, "a list"),
                           ("aggregation", str, "a name"), ("symmetric", bool, "true or false")):
        if key in d and not isinstance(d[key], typ):
            raise InputError(f"topology JSON: {key} is {type(d[key]).__name__}, not {what}")
    for key in ("links", "paths"):
        for i, x in enumerate(d.get(key, [])):
            if not isinstance(x, dict):
                raise InputError(f"topology JSON: {key}[{i}] is {type(x).__name__}, not an object")


def _vertex(x: Any, where: str) -> int | str:
    """A link endpoint: a device (int) or a switch / NIC / host name (str)."""
    if isinstance(x, bool) or not isinstance(x, (int, str)):
        raise InputError(f"topology JSON: {where} = {str(x)[:40]!r} is not a device number or "
                         "a switch name")
    return x


def _cost(x: Any, where: str) -> Any:
    """An alpha / beta: a number, or one per phase (a list of 3 or {phase: number})."""
    if isinstance(x, dict):
        missing = [p for p in PHASES if p not in x]
        if missing:
            raise InputError(f"topology JSON: {where} lacks phase '{missing[0]}'")
        x = [x[p] for p in PHASES]
    vals = x if isinstance(x, list) else [x]
    if not vals or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        raise InputError(f"topology JSON: {where} = {str(x)[:40]} is not a number or "
                         f"{len(PHASES)} numbers")
    return x


def _check_node_of(node_of: Any) -> None:
    """node_of must be a JSON list of 1..DEVICES_MAX non-negative integers (node ids)."""
    from sempar.bounds import DEVICES_MAX

    if not isinstance(node_of, list) or not 1 <= len(node_of) <= DEVICES_MAX:
        raise InputError(f"topology JSON: node_of must be a list of 1..{DEVICES_MAX} node ids")
    for i, n in enumerate(node_of):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(node_of):
            raise InputError(f"topology JSON: node_of[{i}] = {n!r}: node ids are integers "
                             f"0..{len(node_of) - 1}")
