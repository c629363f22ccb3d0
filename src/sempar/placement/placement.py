"""`Placement`: which logical experts each device hosts, per MoE layer (docs/design.md).

Stored as the physical-slot table engines use (DeepSeek EPLB's `phy2log`): `phy2log[l, p]` is
the logical expert in physical slot p of layer l; device g owns the contiguous slots
`[g * S, (g + 1) * S)` with S = `slots_per_device`. A logical expert with more than one slot
has redundant replicas. `node_of[g]` groups devices into nodes. A co-clustering solver also
outputs its `token_table` (token -> device per layer) and, in dp mode, its `request_cluster`
(fit request -> DP rank); `info` holds provenance only.

Invariants (checked by `validate`): every logical expert is hosted at least once per layer,
every device has exactly S slots, no device hosts the same expert twice, node ids are 0..n-1.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sempar.atomic import write_text_atomic
from sempar.errors import InputError
from sempar.predict.token_table import TokenTable
from sempar.trace.layout import check_placement_info

FORMAT_VERSION = 1
# On disk the outputs sit inside "info" after the solver's provenance and before the keys added
# to a finished placement (oracle's, then `solve`'s relabelling, model and layer layout), where
# every placement file has them, so files round-trip byte for byte.
_AFTER_OUTPUTS = ("deployable", "device_relabel", "model")


@dataclass(frozen=True)
class RequestClusters:
    """request_id int64[R] (the fit trace's requests); device int64[R]: the device (DP rank) the
    solver gave each request."""

    request_id: np.ndarray
    device: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "request_id", np.asarray(self.request_id, np.int64))
        object.__setattr__(self, "device", np.asarray(self.device, np.int64))
        if self.request_id.ndim != 1 or self.device.shape != self.request_id.shape:
            raise InputError(f"request_cluster: {self.device.shape} devices for "
                             f"{self.request_id.shape} requests")

    def to_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id.tolist(), "device": self.device.tolist()}

    @classmethod
    def from_json(cls, d: Any) -> "RequestClusters":
        try:
            return cls(np.asarray(d["request_id"]), np.asarray(d["device"]))
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"request_cluster: malformed ({e})") from None


@dataclass
class Placement:
    """phy2log: int32[L, G * S]; node_of: int32[G]; token_table: the solver's `TokenTable` or
    None (placement-only methods); request_cluster: its dp-mode request clusters or None."""

    phy2log: np.ndarray
    num_experts: int
    num_devices: int
    node_of: np.ndarray | None = None
    method: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    token_table: TokenTable | None = None
    request_cluster: RequestClusters | None = None

    def __post_init__(self) -> None:
        self.phy2log = np.asarray(self.phy2log, dtype=np.int32)
        if self.node_of is None:
            self.node_of = np.zeros(self.num_devices, np.int32)
        self.node_of = np.asarray(self.node_of, dtype=np.int32)

    @property
    def num_layers(self) -> int:
        return int(self.phy2log.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.phy2log.shape[1])

    @property
    def slots_per_device(self) -> int:
        return self.num_slots // self.num_devices

    @property
    def num_nodes(self) -> int:
        return int(self.node_of.max()) + 1 if self.node_of.size else 1

    @property
    def redundant(self) -> int:
        return self.num_slots - self.num_experts

    def slots(self, layer: int) -> np.ndarray:
        """int32[G, S]: the experts each device hosts at `layer`."""
        return self.phy2log[layer].reshape(self.num_devices, self.slots_per_device)

    def hosts(self) -> np.ndarray:
        """bool[L, G, N]: hosts[l, g, e] when device g holds a replica of expert e at layer l."""
        L, G, N = self.num_layers, self.num_devices, self.num_experts
        out = np.zeros((L, G, N), bool)
        dev = np.repeat(np.arange(G), self.slots_per_device)
        for l in range(L):
            out[l, dev, self.phy2log[l]] = True
        return out

    def logcnt(self) -> np.ndarray:
        """int32[L, N]: replicas of each logical expert."""
        return np.stack([np.bincount(row, minlength=self.num_experts) for row in self.phy2log]
                        ).astype(np.int32)

    def log2phy(self) -> np.ndarray:
        """int32[L, N, maxcnt]: physical slots of each logical expert, padded with -1."""
        cnt = self.logcnt()
        out = np.full((self.num_layers, self.num_experts, int(cnt.max())), -1, np.int32)
        for l in range(self.num_layers):
            order = np.argsort(self.phy2log[l], kind="stable")
            experts = self.phy2log[l][order]
            rank = np.arange(order.size) - np.searchsorted(experts, experts, side="left")
            out[l, experts, rank] = order
        return out

    def validate(self) -> "Placement":
        L, P = self.phy2log.shape if self.phy2log.ndim == 2 else (0, 0)
        if self.phy2log.ndim != 2 or L == 0:
            raise InputError(f"phy2log: shape {self.phy2log.shape} is not (layers, physical slots)")
        G, N = self.num_devices, self.num_experts
        if G < 1 or P % G:
            raise InputError(f"phy2log: {P} physical slots do not split evenly over {G} devices")
        if P < N:
            raise InputError(f"phy2log: {P} slots cannot host {N} experts")
        bad = (self.phy2log < 0) | (self.phy2log >= N)
        if bad.any():
            l, p = (int(i) for i in np.argwhere(bad)[0])
            raise InputError(f"phy2log: layer {l} slot {p}: expert {int(self.phy2log[l, p])} out "
                             f"of range [0, {N})")
        for l in range(L):
            s = np.sort(self.slots(l), axis=1)
            dup = s[:, 1:] == s[:, :-1]
            if dup.any():
                g, i = (int(x) for x in np.argwhere(dup)[0])
                raise InputError(f"phy2log: layer {l}: device {g} hosts expert {int(s[g, i])} twice")
        cnt = self.logcnt()
        missing = cnt == 0
        if missing.any():
            l, e = (int(i) for i in np.argwhere(missing)[0])
            raise InputError(f"phy2log: layer {l}: expert {e} is hosted nowhere")
        if self.node_of.shape != (G,):
            raise InputError(f"node_of: {self.node_of.shape[0]} entries for {G} devices")
        t = self.token_table
        if t is not None and (t.num_layers != L or (t.device.size and (
                int(t.device.min()) < 0 or int(t.device.max()) >= G))):
            raise InputError(f"token_table: {t.num_layers} layers of devices in "
                             f"[{int(t.device.min()) if t.device.size else 0}, "
                             f"{int(t.device.max()) if t.device.size else 0}], expected {L} "
                             f"layers of devices 0..{G - 1}")
        c = self.request_cluster
        if c is not None and c.device.size and (int(c.device.min()) < 0 or int(c.device.max()) >= G):
            raise InputError(f"request_cluster: a device id outside 0..{G - 1}")
        if set(np.unique(self.node_of).tolist()) != set(range(self.num_nodes)):
            raise InputError(f"node_of: node ids {sorted(set(self.node_of.tolist()))} are not 0..n-1")
        return self

    def to_json(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "method": self.method,
                "num_layers": self.num_layers, "num_experts": self.num_experts,
                "num_devices": self.num_devices, "slots_per_device": self.slots_per_device,
                "node_of": self.node_of.tolist(), "phy2log": self.phy2log.tolist(),
                "info": self._info_json()}

    def _info_json(self) -> dict[str, Any]:
        """`info` with the outputs inserted before the first of `_AFTER_OUTPUTS`."""
        outputs: dict[str, Any] = {}
        if self.request_cluster is not None:
            outputs["request_cluster"] = self.request_cluster.to_json()
        if self.token_table is not None:
            outputs["token_table"] = self.token_table.to_json()
        keys = list(self.info)
        cut = next((i for i, k in enumerate(keys) if k in _AFTER_OUTPUTS), len(keys))
        return {**{k: self.info[k] for k in keys[:cut]}, **outputs,
                **{k: self.info[k] for k in keys[cut:]}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Placement":
        if d.get("format_version") != FORMAT_VERSION:
            raise InputError(f"placement.format_version: {d.get('format_version')!r} is not "
                             f"supported (this sempar reads {FORMAT_VERSION})")
        _check_fields(d)
        if not isinstance(d.get("method", ""), str):
            raise InputError(f"placement.method: {d.get('method')!r} is not a method name")
        info = check_placement_info(d.get("info", {}), len(d["phy2log"]), d["num_experts"])
        try:
            table, clusters = info.pop("token_table", None), info.pop("request_cluster", None)
            p = cls(phy2log=np.asarray(d["phy2log"]), num_experts=int(d["num_experts"]),
                    num_devices=int(d["num_devices"]), node_of=np.asarray(d["node_of"]),
                    method=str(d.get("method", "")), info=info,
                    token_table=None if table is None else TokenTable.from_json(table),
                    request_cluster=None if clusters is None else RequestClusters.from_json(clusters))
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(f"placement: malformed field ({err})") from None
        if p.num_layers != d.get("num_layers", p.num_layers) or \
                p.slots_per_device != d.get("slots_per_device", p.slots_per_device):
            raise InputError("placement: num_layers / slots_per_device contradict phy2log")
        return p.validate()

    def save(self, path: str | os.PathLike) -> None:
        self.validate()
        write_text_atomic(path, json.dumps(self.to_json()) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Placement":
        from sempar.bounds import PLACEMENT_JSON_BYTES_MAX
        from sempar.safe_json import read_json_object

        return cls.from_json(read_json_object(path, "placement file", PLACEMENT_JSON_BYTES_MAX))


def _check_fields(d: dict[str, Any]) -> None:
    """Types and ranges of a placement JSON before any array is built (no int32 wrap-around)."""
    from sempar.bounds import DEVICES_MAX, check_bound

    for key, hi in (("num_devices", DEVICES_MAX), ("num_experts", 1 << 20)):
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(f"placement.{key}: {v!r} is not an integer")
        check_bound(f"placement.{key}", v, 1, hi)
    for key in ("phy2log", "node_of"):
        a = np.asarray(d.get(key), dtype=object)
        if a.ndim != (2 if key == "phy2log" else 1) or a.size == 0:
            raise InputError(f"placement.{key}: expected a non-empty "
                             f"{'list of lists' if key == 'phy2log' else 'list'} of integers")
        flat = a.ravel()
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in flat):
            raise InputError(f"placement.{key}: holds a value that is not an integer")
        if not all(-(1 << 31) <= x < (1 << 31) for x in flat):
            raise InputError(f"placement.{key}: holds an id beyond 32 bits")


def contiguous_nodes(num_devices: int, num_nodes: int) -> np.ndarray:
    """int32[G]: devices 0..G-1 split into `num_nodes` equal contiguous nodes."""
    if num_nodes < 1 or num_devices % num_nodes:
        raise InputError(f"--nodes: {num_nodes} does not divide the {num_devices} devices")
    return (np.arange(num_devices) // (num_devices // num_nodes)).astype(np.int32)


def cross_group_slots(placement: Placement, num_groups: int) -> np.ndarray:
    """bool[L, S]: slots whose expert lies outside the slot's expert group.

    With `num_groups` groups of N / num_groups consecutive expert ids (DeepSeek-V3's group-limited
    routing), slot s of the first N belongs to group s // (N / num_groups); replica slots beyond
    N have no group range and are never flagged. All False when num_groups <= 1.
    """
    N = placement.num_experts
    bad = np.zeros(placement.phy2log.shape, bool)
    if num_groups <= 1:
        return bad
    if N % num_groups:
        raise InputError(f"{num_groups} expert groups do not divide {N} experts")
    size = N // num_groups
    slot = np.arange(placement.num_slots)
    bad = placement.phy2log // size != np.minimum(slot // size, num_groups - 1)[None, :]
    return bad & (slot[None, :] < N)

