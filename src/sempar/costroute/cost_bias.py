"""Cost-aware gate bias tables (CAMoE §3.4, eqs. 8-13) and the all-to-all time of a routing.

Vocabulary (docs/design.md; CAMoE's symbols in brackets). Endpoints are devices (CAMoE's `N` with
the device -> endpoint map delta = identity: its 4-GPU testbed had one GPU per endpoint; ours).

- `home`: int[T], the device each token's hidden state sits on when the router runs [sigma(i),
  the source-endpoint indicator S in one-hot form].
- `hosts`: bool[L, G, E] from `Placement.hosts()` [M_l^T: hosts[l, v, e] = [M_l]_{e, v}].
- `dest`: int32[L, G, E], the device a token on home u sends its expert-e activation to at layer
  l: u itself if u hosts e, else the replica of e with the cheapest dispatch link from u (ours:
  CAMoE's M_l is one-hot, i.e. has no replicas).
- `n_disp`: float64[..., L, G, G] dispatched activation counts, source u -> expert device v
  [N_l^disp = S^T A_l M_l, eq. 10]. The diagonal (u == v) is local and crosses no link.
- `TokenBytes`: bytes per dispatched activation (`hidden * elem + s_prob`), per combined one
  (`hidden * elem`) and of the metadata message per pair (`E * s_cnt`) [S^disp, S^comb, §3.2].
- `c_tw`: float64[L, G, G], the traffic-weighted time proxy of eq. 11:
  alpha^d + beta^d * B^disp + (alpha^c)^T + (beta^c)^T * B^comb, with B = S * N from one-shot
  traffic accounting (a lambda = 0 pass; ours: the mean per forward over its batches).
- `unit`: float32[L, G, E] = -zscore_row(c_tw) M^T (eq. 13 at lambda_cost = 1); the table for
  a lambda is `lam * unit`, and the router adds row `home[i]` of it to token i's logits
  [Z' = Z + S G, eq. 13]. With replicas, expert e on several devices, ours takes the cheapest:
  unit[l, u, e] = -min over v hosting e of zscore_row(c_tw)[l, u, v] (= -C^ M^T without replicas).

The all-to-all time of one layer follows CAMoE eq. 9 on `Topology.a2a_seconds` (max over
directed pairs, a pair that sends nothing pays nothing): metadata (E * s_cnt bytes to every
other device) + dispatch (n_disp * S^disp, u -> v) + combine (n_disp^T * S^comb, v -> u: the
outputs travel back, so the combine matrix is the transpose; eq. 9 writes N^comb_uv = N^disp_uv
and leaves the direction implicit; eq. 11 uses the transpose as we do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sempar.errors import InputError
from sempar.placement import serving

EPS = 1e-12     # eq. 12's epsilon (a row of equal costs gives a zero row, not NaN)


@dataclass(frozen=True)
class TokenBytes:
    """Bytes per dispatched activation, per combined activation, and of one metadata message."""

    dispatch: float
    combine: float
    metadata: float

    @classmethod
    def for_model(cls, hidden: int, top_k: int, num_experts: int, elem_bytes: int = 2,
                  prob_bytes: int = 4, count_bytes: int = 4) -> "TokenBytes":
        """CAMoE §3.2: dispatch = hidden * elem + s_prob (ours: s_prob = k fp32 routing weights),
        combine = hidden * elem, metadata = E * s_cnt (int32 counts); elem 2 = bf16."""
        if hidden < 1 or top_k < 1 or num_experts < 1 or elem_bytes < 1:
            raise InputError(f"token bytes: hidden {hidden}, top-k {top_k}, experts "
                             f"{num_experts}, element bytes {elem_bytes} must all be positive")
        return cls(float(hidden * elem_bytes + top_k * prob_bytes), float(hidden * elem_bytes),
                   float(num_experts * count_bytes))

    @classmethod
    def for_option(cls, hidden: int, top_k: int, num_experts: int,
                   token_bytes: int | None = None) -> "TokenBytes":
        """`for_model`, or with `--token-bytes` B: dispatch B + k fp32 weights, combine B."""
        if token_bytes is None:
            return cls.for_model(hidden, top_k, num_experts)
        return cls(float(token_bytes + 4 * top_k), float(token_bytes), float(4 * num_experts))

    def to_json(self) -> dict[str, float]:
        return {"dispatch": self.dispatch, "combine": self.combine, "metadata": self.metadata}


def zscore_row(c: np.ndarray, eps: float = EPS) -> np.ndarray:
    """CAMoE eq. 12: (C - row mean) / (row std + eps), per row over the last axis.

    c: float[..., U, V] -> float64[..., U, V]; std is the population std (ddof 0), so each row
    has mean 0 and variance 1 (up to eps), as the paper says.
    """
    c = np.asarray(c, dtype=np.float64)
    if c.ndim < 2:
        raise InputError(f"zscore_row: expected a matrix, got shape {list(c.shape)}")
    mu = c.mean(axis=-1, keepdims=True)
    sd = c.std(axis=-1, keepdims=True)
    return (c - mu) / (sd + eps)


def _check_hosts(hosts: np.ndarray, num_devices: int | None = None) -> np.ndarray:
    hosts = np.asarray(hosts, dtype=bool)
    if hosts.ndim != 3:
        raise InputError(f"hosts: expected bool[L, G, E], got shape {list(hosts.shape)}")
    if num_devices is not None and hosts.shape[1] != num_devices:
        raise InputError(f"placement has {hosts.shape[1]} devices, the topology "
                         f"{num_devices}: give --ep {num_devices} or another topology")
    missing = ~hosts.any(axis=1)
    if missing.any():
        l, e = (int(i) for i in np.argwhere(missing)[0])
        raise InputError(f"placement: layer {l}: expert {e} is hosted nowhere")
    return hosts


def destination_table(hosts: np.ndarray, topology: Any | None = None,
                      ref_bytes: float = 4096.0) -> np.ndarray:
    """int32[L, G, E]: where a token on device u sends its expert-e activation at layer l.

    hosts: bool[L, G, E]. u itself when it hosts e; otherwise the replica cheapest to reach
    from u (dispatch alpha + beta * ref_bytes; ties and no topology: the lowest device id): the
    comm simulator's cost order (`placement.serving.cost_order`).
    """
    hosts = _check_hosts(hosts, topology.num_devices if topology is not None else None)
    G = hosts.shape[1]
    order = (serving.cost_order(topology.pair_cost("dispatch", ref_bytes))
             if topology is not None else serving.node_order(np.zeros(G, np.int32)))    # [G, G]
    return np.stack([serving.table(h, order) for h in hosts]).astype(np.int32)


def dispatch_counts(experts: np.ndarray, home: np.ndarray, dest: np.ndarray,
                    dedup: bool = False) -> np.ndarray:
    """CAMoE eq. 10: float64[L, G, G] activations sent from home u to expert device v.

    experts: int[T, L, k] logical expert ids; home: int[T] in 0..G-1; dest: int32[L, G, E].
    dedup=False counts every (token, expert) assignment (eq. 8's C_ie); dedup=True counts one
    copy per (token, destination device), the one-shot de-duplicated dispatch of s-MoE /
    DeepEP (docs/design.md, remote copies).
    """
    experts = np.asarray(experts)
    home = np.asarray(home, dtype=np.int64)
    if experts.ndim != 3 or home.shape != (experts.shape[0],):
        raise InputError(f"dispatch_counts: experts {list(experts.shape)} must be [T, L, k] and "
                         f"home {list(home.shape)} [T]")
    L, G, E = dest.shape
    T, Le, k = experts.shape
    if Le != L:
        raise InputError(f"routing has {Le} MoE layers, the placement {L}")
    if T and (experts.min() < 0 or experts.max() >= E):
        raise InputError(f"expert ids must lie in [0, {E}), got {int(experts.min())}.."
                         f"{int(experts.max())}")
    if T and (home.min() < 0 or home.max() >= G):
        raise InputError(f"home devices must lie in [0, {G}), got {int(home.min())}..{int(home.max())}")
    out = np.zeros((L, G, G), np.float64)
    for l in range(L):
        v = dest[l][home[:, None], experts[:, l, :]]                             # [T, k]
        if dedup:
            v = np.sort(v, axis=1)
            first = np.ones_like(v, dtype=bool)
            first[:, 1:] = v[:, 1:] != v[:, :-1]
            src = np.broadcast_to(home[:, None], v.shape)[first]
            v = v[first]
        else:
            src = np.broadcast_to(home[:, None], v.shape).ravel()
            v = v.ravel()
        out[l] = np.bincount(src * G + v, minlength=G * G).reshape(G, G)
    return out


def traffic_weighted_cost(topology: Any, n_disp: np.ndarray, nbytes: TokenBytes) -> np.ndarray:
    """CAMoE eq. 11: float64[L, G, G] = alpha^d + beta^d * B^disp + (alpha^c)^T + (beta^c)^T * B^comb.

    n_disp: float[L, G, G] one-shot dispatch counts (per forward); B^disp = S^disp * n_disp,
    B^comb = S^comb * n_disp. The diagonal is 0 (the topology's local pair costs nothing)."""
    n = np.asarray(n_disp, dtype=np.float64)
    G = topology.num_devices
    if n.ndim != 3 or n.shape[1:] != (G, G):
        raise InputError(f"dispatch counts {list(n.shape)} do not match the topology's {G} devices")
    ad, bd = topology.alpha[1], topology.beta[1]
    ac, bc = topology.alpha[2], topology.beta[2]
    return (ad + bd * (nbytes.dispatch * n)) + (ac.T + bc.T * (nbytes.combine * n))


def unit_bias(c_tw: np.ndarray, hosts: np.ndarray, eps: float = EPS) -> np.ndarray:
    """CAMoE eq. 13 at lambda_cost = 1: float32[L, G, E] = -zscore_row(c_tw) M^T.

    c_tw: float[L, G, G]; hosts: bool[L, G, E] (M_l^T). A replicated expert takes its cheapest
    replica's (lowest) standardised cost (ours; the paper's M is one-hot)."""
    hosts = _check_hosts(hosts)
    z = zscore_row(c_tw, eps)                                                  # [L, U, V]
    if z.shape[0] != hosts.shape[0] or z.shape[2] != hosts.shape[1]:
        raise InputError(f"cost tables {list(z.shape)} and placement {list(hosts.shape)} "
                         "disagree on layers or devices")
    masked = np.where(hosts[:, None, :, :], z[:, :, :, None], np.inf)          # [L, U, V, E]
    return (-masked.min(axis=2)).astype(np.float32)


@dataclass
class CostBiasTables:
    """The per-layer gate-bias tables of one topology and placement.

    unit: float32[L, G, E] (lambda = 1); c_tw: float64[L, G, G] (eq. 11); n_disp: float64[L, G, G]
    (the one-shot per-forward dispatch counts they came from); dest: int32[L, G, E]."""

    unit: np.ndarray
    c_tw: np.ndarray
    n_disp: np.ndarray
    dest: np.ndarray
    topology: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return int(self.unit.shape[0])

    @property
    def num_devices(self) -> int:
        return int(self.unit.shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.unit.shape[2])

    def at(self, lam: float) -> np.ndarray:
        """float32[L, G, E]: G^(l) = -lam * zscore_row(C_tw) M^T (eq. 13)."""
        if not np.isfinite(lam) or lam < 0:
            raise InputError(f"lambda_cost: {lam} is not a non-negative number")
        return (np.float32(lam) * self.unit).astype(np.float32)

    def nbytes_fp16(self) -> int:
        """Size of the online cache (CAMoE §3.4 Complexity: L x E per source, FP16)."""
        return int(self.unit.size * 2)


def build_tables(topology: Any, hosts: np.ndarray, n_disp: np.ndarray, nbytes: TokenBytes,
                 dest: np.ndarray | None = None, eps: float = EPS) -> CostBiasTables:
    """Eqs. 11-13 from one-shot counts: n_disp float[L, G, G] (per forward, lambda = 0)."""
    hosts = _check_hosts(hosts, topology.num_devices)
    c = traffic_weighted_cost(topology, n_disp, nbytes)
    if dest is None:
        dest = destination_table(hosts, topology, nbytes.dispatch)
    return CostBiasTables(unit_bias(c, hosts, eps), c, np.asarray(n_disp, np.float64), dest,
                          topology.name, {"bytes": nbytes.to_json(), "eps": eps})


def a2a_layer_seconds(topology: Any, n_disp: np.ndarray, nbytes: TokenBytes) -> dict[str, np.ndarray]:
    """CAMoE eq. 9 per layer: {"metadata", "dispatch", "combine", "total"} -> float64[...].

    n_disp: float[..., G, G] (e.g. [batches, L, G, G]); local pairs (diagonal) send nothing."""
    n = np.asarray(n_disp, dtype=np.float64)
    G = topology.num_devices
    if n.shape[-2:] != (G, G):
        raise InputError(f"dispatch counts {list(n.shape)} do not end in [{G}, {G}]")
    off = ~np.eye(G, dtype=bool)
    n = np.where(off, n, 0.0)
    meta = np.broadcast_to(np.where(off, nbytes.metadata, 0.0), n.shape)
    out = {"metadata": np.asarray(topology.a2a_seconds("metadata", meta)),
           "dispatch": np.asarray(topology.a2a_seconds("dispatch", n * nbytes.dispatch)),
           "combine": np.asarray(topology.a2a_seconds("combine",
                                                      np.swapaxes(n, -1, -2) * nbytes.combine))}
    out["total"] = out["metadata"] + out["dispatch"] + out["combine"]
    return out


def link_cost_share(topology: Any, n_disp: np.ndarray, nbytes: TokenBytes,
                    threshold: float | None = None) -> float:
    """Fraction of all activations (local included) sent over an expensive link: dispatch pair
    cost alpha + beta * S^disp above `threshold` (ours, default: halfway between the cheapest
    and the dearest off-diagonal pair). n_disp: float[..., G, G]."""
    n = np.asarray(n_disp, dtype=np.float64)
    G = topology.num_devices
    cost = topology.pair_cost("dispatch", nbytes.dispatch)
    off = ~np.eye(G, dtype=bool)
    if threshold is None:
        threshold = 0.5 * float(cost[off].min() + cost[off].max()) if G > 1 else 0.0
    expensive = off & (cost > threshold)
    total = n.sum()
    return float((n * expensive).sum() / total) if total else 0.0
