"""The lambda controller (CAMoE §3.4, "Dynamic adaptation").

CAMoE says only: "A lightweight controller can tune lambda_cost from observed vs. predicted A2A
time and sparsely micro-probe predicted bottlenecks to refresh a few (alpha, beta)". Ours makes
that concrete, off the forward path (once per window of forwards):

1. Track drift: `ratio` = EMA of observed / predicted all-to-all seconds (predicted = CAMoE
   eq. 9 on the profiled topology for the routing just run). |ratio - 1| > `drift_tol` raises
   `refresh`: the caller micro-probes the predicted bottleneck pairs (`bottleneck_pairs`),
   refreshes their beta (`refresh_links`) and rebuilds the tables (`build_tables`).
2. Steer lambda: a proportional step on the relative error of the observed time against the
   target, lam <- clip(lam + gain * (observed - target) / target, lam_min, lam_max): too slow
   -> more bias toward cheap devices, faster than needed -> less (back toward the model's own
   routing).
3. Guard quality: when a routing-shift figure (KL against lambda = 0, CAMoE Table 2) exceeds
   `kl_budget`, lambda is multiplied by `backoff` instead (quality wins over latency).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from sempar.errors import InputError


@dataclass(kw_only=True)
class ControllerStep:
    lam: float            # lambda for the next window
    error: float          # (observed - target) / target
    ratio: float          # EMA of observed / predicted
    refresh: bool         # the link model drifted: re-probe bottlenecks, rebuild the tables
    reason: str           # "steer" | "kl-guard" | "hold"


@dataclass
class LambdaController:
    """Tune lambda_cost toward an all-to-all time target (seconds per MoE layer, mean)."""

    target_seconds: float
    lam: float = 0.0
    lam_min: float = 0.0
    lam_max: float = 0.5
    gain: float = 0.1
    kl_budget: float | None = None
    backoff: float = 0.5
    ema: float = 0.3
    drift_tol: float = 0.25
    deadband: float = 0.01          # |error| below this holds lambda
    ratio: float = 1.0
    history: list[ControllerStep] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (np.isfinite(self.target_seconds) and self.target_seconds > 0):
            raise InputError(f"controller target: {self.target_seconds} s is not positive")
        if not 0 <= self.lam_min <= self.lam_max:
            raise InputError(f"controller: need 0 <= lam_min <= lam_max, got "
                             f"{self.lam_min}, {self.lam_max}")
        if not (0 < self.backoff < 1 and 0 < self.ema <= 1 and self.gain > 0):
            raise InputError("controller: need 0 < backoff < 1, 0 < ema <= 1, gain > 0")
        self.lam = float(np.clip(self.lam, self.lam_min, self.lam_max))

    def update(self, observed_s: float, predicted_s: float | None = None,
               kl: float | None = None) -> ControllerStep:
        """One window: observed (measured) and predicted (eq. 9) seconds, optional KL."""
        if not (np.isfinite(observed_s) and observed_s >= 0):
            raise InputError(f"controller: observed time {observed_s} is not a non-negative number")
        if predicted_s is not None and predicted_s > 0:
            self.ratio = (1 - self.ema) * self.ratio + self.ema * observed_s / predicted_s
        error = (observed_s - self.target_seconds) / self.target_seconds
        if kl is not None and self.kl_budget is not None and kl > self.kl_budget:
            lam, reason = self.lam * self.backoff, "kl-guard"
        elif abs(error) <= self.deadband:
            lam, reason = self.lam, "hold"
        else:
            lam, reason = self.lam + self.gain * error, "steer"
        self.lam = float(np.clip(lam, self.lam_min, self.lam_max))
        step = ControllerStep(lam=self.lam, error=float(error), ratio=float(self.ratio),
                              refresh=bool(abs(self.ratio - 1) > self.drift_tol), reason=reason)
        self.history.append(step)
        return step

    def run(self, window: Callable[[float], tuple[float, float | None, float | None]],
            steps: int) -> list[ControllerStep]:
        """Drive `window(lam) -> (observed_s, predicted_s, kl)` for `steps` windows."""
        out = []
        for _ in range(steps):
            observed, predicted, kl = window(self.lam)
            out.append(self.update(observed, predicted, kl))
        return out


def bottleneck_pairs(topology: Any, n_disp: np.ndarray, dispatch_bytes: float,
                     top: int = 3) -> list[tuple[int, int]]:
    """The `top` directed pairs with the largest predicted dispatch cost for counts
    n_disp: float[G, G] (what CAMoE's controller micro-probes)."""
    n = np.asarray(n_disp, dtype=np.float64).copy()
    np.fill_diagonal(n, 0.0)
    cost = np.asarray(topology.cost("dispatch", n * dispatch_bytes))
    order = np.argsort(cost, axis=None)[::-1][:top]
    return [(int(i // cost.shape[1]), int(i % cost.shape[1])) for i in order if cost.flat[i] > 0]


def refresh_links(topology: Any, probes: dict[tuple[int, int], tuple[float, float]],
                  phase: str = "dispatch") -> Any:
    """Refit beta of probed pairs from one observation each: {(u, v): (bytes, seconds)}.

    Ours: one probe cannot fit both parameters, so alpha is kept and
    beta = max(0, seconds - alpha) / bytes. Returns a new Topology (the input is unchanged)."""
    from sempar.comm.topology import PHASES, Topology

    p = PHASES.index(phase)
    alpha, beta = topology.alpha.copy(), topology.beta.copy()
    for (u, v), (nbytes, seconds) in probes.items():
        if u == v or nbytes <= 0:
            raise InputError(f"probe ({u}, {v}): needs two distinct devices and bytes > 0")
        beta[p, u, v] = max(0.0, seconds - alpha[p, u, v]) / nbytes
    return Topology(topology.name, topology.node_of.copy(), alpha, beta)
