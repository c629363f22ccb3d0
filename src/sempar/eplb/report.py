"""What one engine-balancer rebalance did (`RebalanceReport`, the plug-ins' log line and
gauges) and the LAR it reports: the share of FILE's sample activations on the device hosting
most of each row's k experts (`_lar`). Split from `policy` (one concept per module)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RebalanceReport:
    """What the last rebalance did: slots whose expert changed (`moves`), layers re-laid,
    mean imbalance (max / mean device load of the live window) and locality before / after,
    LAR on FILE's sample rows (None without one), seconds spent."""

    moves: int = 0
    layers_changed: int = 0
    imbalance_before: float = 0.0
    imbalance_after: float = 0.0
    locality_before: float = 0.0
    locality_after: float = 0.0
    lar_before: float | None = None
    lar_after: float | None = None
    budget: int | None = None
    seconds: float = 0.0
    per_layer_moves: list[int] = field(default_factory=list)
    layout: str = ""            # FILE's locality layout used (`Source.home`), with a fallback's why

    def line(self) -> str:
        lar = ("" if self.lar_after is None else
               f", LAR {self.lar_before:.3f} -> {self.lar_after:.3f}")
        return (f"{self.moves} slots moved in {self.layers_changed} layers, imbalance "
                f"{self.imbalance_before:.3f} -> {self.imbalance_after:.3f}, locality "
                f"{self.locality_before:.3f} -> {self.locality_after:.3f}{lar}, "
                f"{self.seconds * 1e3:.0f} ms" + (f", layout {self.layout}" if self.layout else ""))


def _hosts(row: np.ndarray, G: int, N: int) -> np.ndarray:
    """bool[G, N] of a slot row int[P] (slot p on device p // S; -1 slots host nothing)."""
    S = row.size // G
    h = np.zeros((G, N + 1), bool)
    r = np.where(row < 0, N, row)
    h[np.repeat(np.arange(G), S), r] = True
    return h[:, :N]


def _lar(sample: np.ndarray, maps: np.ndarray, G: int, N: int) -> float:
    """Share of the sample's activations on the device hosting most of each row's k experts
    (the device state, `affinity.affinity_stats.device_states`' rule), all layers."""
    T, L, k = sample.shape
    local = 0.0
    for l in range(L):
        hosts = _hosts(maps[l], G, N)
        hits = hosts[:, sample[:, l]].sum(axis=2)             # [G, T]
        local += float(hits.max(axis=0).sum())
    return local / (T * L * k)


_LAR_SEEN: dict[bytes, float] = {}


def _lar_cached(rows: np.ndarray, m: np.ndarray, G: int, N: int) -> float:
    """`_lar`, remembered for the last few maps: the old map of a rebalance is usually the
    map the previous one returned."""
    key = hashlib.sha1(m.tobytes() + rows.tobytes()[:4096] + bytes([G % 256])).digest()
    if key not in _LAR_SEEN:
        if len(_LAR_SEEN) > 8:
            _LAR_SEEN.clear()
        _LAR_SEEN[key] = _lar(rows, m, G, N)
    return _LAR_SEEN[key]
