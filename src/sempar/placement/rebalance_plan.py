"""The incremental re-placement step's plan: its knobs (`RebalanceConfig`), the moves it makes
(`Move`) and its result (`RebalanceResult`); the step itself is `placement.rebalance`.

Cost model (`RebalanceConfig`): a move copies `experts x expert_bytes` over a link of
`link_gbps` (copy time, reported); it saves `gain x tokens_per_s x remote_bytes` bytes per second
of all-to-all traffic, gain = remote activations avoided per token (exact, on the window),
remote_bytes = hidden x dtype bytes each way (dispatch and combine). Payback time = copied bytes /
saved bytes per second; a locality move is made when payback <= `horizon_s`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from sempar.errors import InputError
from sempar.placement.capacity import BATCH

EPS = 1e-9


@dataclass(frozen=True)
class RebalanceConfig:
    """Budget, bound and cost model of one incremental step (module docstring)."""

    max_moves: int = 64                 # moves per step (a swap is one move, two copies)
    max_bytes: float | None = None      # copied bytes per step (None: no byte budget)
    max_imbalance: float = 1.10         # per-layer max / mean served load on the window
    expert_bytes: float = 1.0           # bytes of one expert copy (model shape)
    remote_bytes: float = 1.0           # bytes one remote activation moves (dispatch + combine)
    tokens_per_s: float = 20_000.0      # the deployment's token throughput the gain is paid on
    horizon_s: float = 300.0            # a locality move must pay its copy back within this
    link_gbps: float = 50.0             # GB/s of the link weights are copied over (copy time)
    batch: int = BATCH                  # tp batch of the exact homes
    candidates: int = 12                # moves per layer re-evaluated exactly each round
    trade: float = 0.1                  # balance moves: local activations one unit of overload
                                        # cut is worth (0: the largest cut, locality breaks ties)
    split: bool = False                 # the bound on the load a balancing dispatch serves:
                                        # a replicated expert's load water-filled over its copies
                                        # (`dispatch_peak.fill_loads`); False: the nearest copy

    def __post_init__(self) -> None:
        if self.max_moves < 0 or not 1.0 <= self.max_imbalance < 100:
            raise InputError(f"rebalance: max_moves {self.max_moves} / max_imbalance "
                             f"{self.max_imbalance} out of range")
        for name in ("expert_bytes", "remote_bytes", "tokens_per_s", "horizon_s", "link_gbps"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"rebalance: {name} {v} is not a positive number")


@dataclass
class Move:
    """One move: `kind` swap (expert_a on device_a <-> expert_b on device_b) or retarget
    (device_a's replica of expert_a becomes expert_b); gain in local activations per window
    token at this layer (exact), imbalance before / after, why (balance or locality)."""

    layer: int
    kind: str
    device_a: int
    expert_a: int
    device_b: int
    expert_b: int
    copies: int
    bytes: float
    gain: float
    imbalance_before: float
    imbalance_after: float
    reason: str
    payback_s: float | None = None


@dataclass
class RebalanceResult:
    """The moves made, in order, and the window's figures before and after."""

    moves: list[Move] = field(default_factory=list)
    lar_before: float = 0.0
    lar_after: float = 0.0
    imbalance_before: list[float] = field(default_factory=list)   # per layer
    imbalance_after: list[float] = field(default_factory=list)
    skipped_unpaid: int = 0           # best locality moves refused by the payback rule
    solve_s: float = 0.0

    @property
    def copied_bytes(self) -> float:
        return float(sum(m.bytes for m in self.moves))

    def to_json(self, cfg: RebalanceConfig) -> dict:
        return {"moves": [asdict(m) for m in self.moves], "num_moves": len(self.moves),
                "expert_copies": int(sum(m.copies for m in self.moves)),
                "copied_bytes": self.copied_bytes,
                "copy_s": self.copied_bytes / (cfg.link_gbps * 1e9),
                "lar_before": self.lar_before, "lar_after": self.lar_after,
                "expected_gain": self.lar_after - self.lar_before,
                "imbalance_before": float(np.mean(self.imbalance_before)),
                "imbalance_after": float(np.mean(self.imbalance_after)),
                "imbalance_max_layer_after": float(np.max(self.imbalance_after)),
                "skipped_unpaid": self.skipped_unpaid, "solve_s": self.solve_s,
                "config": asdict(cfg)}
