"""`sempar replay`: serve a stream step by step under each re-placement policy and measure it.

The stream's requests in arrival order: the first `window` requests are the warm-up every policy
starts from (its `start` solve); then steps of `every` requests. Before step s > 0 each policy
may update its placement from the last `window` requests served (`sempar-incremental`: and the
`history` windows before them, `ReplayConfig.span`); then the step's requests are
served on it. Per step and policy (`StepFigures`):

- `lar`: exact-home LAR of the step's requests (tp mode: `schedule.homes.oracle_home`, equal
  shares per batch, the rows' real experts; needs no token ids);
- `imbalance`: per layer max / mean of the devices' served loads (`placement.metrics`), its mean
  over layers (`imbalance`) and its worst layer (`imbalance_max`);
- `migrated_bytes`: experts the update copied (`migration.copied_experts`) x the model's expert
  bytes; `solve_s`: the update's wall time.

Summary per policy: `lar_mean` (mean over steps), `imbalance_p95` (95th percentile over steps of
the step's mean-over-layers imbalance), `imbalance_layer_p95` (over every step and layer),
`migrated_bytes` (sum), `solve_s_mean` / `solve_s_max` (updates only).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from sempar.drift.policies import POLICIES, ReplayConfig, solve_window
from sempar.drift.streams import request_table
from sempar.errors import InputError
from sempar.placement.metrics import placement_figures
from sempar.placement.migration import copied_experts
from sempar.placement.placement import Placement
from sempar.schedule.homes import oracle_home
from sempar.trace.schema import RoutingTrace


@dataclass
class StepFigures:
    step: int
    first_request: int
    requests: int
    tokens: int
    lar: float
    imbalance: float
    imbalance_max: float
    migrated_experts: int
    migrated_bytes: float
    solve_s: float


def serve_figures(p: Placement, experts: np.ndarray, batch: int) -> tuple[float, np.ndarray]:
    """(exact-home LAR, per-layer imbalance float[L]) of `p` serving rows experts int[T, L, k]."""
    f = placement_figures(p, experts, oracle_home(p, experts, batch))
    load = f["load"]
    return f["lar_mean"], load.max(axis=1) / np.maximum(load.mean(axis=1), 1e-12)


def summary(steps: list[StepFigures], layer_imb: list[np.ndarray]) -> dict:
    upd = [s.solve_s for s in steps[1:]]
    return {"lar_mean": float(np.mean([s.lar for s in steps])),
            "imbalance_p95": float(np.percentile([s.imbalance for s in steps], 95)),
            "imbalance_mean": float(np.mean([s.imbalance for s in steps])),
            "imbalance_layer_p95": float(np.percentile(np.concatenate(layer_imb), 95)),
            "migrated_bytes": float(sum(s.migrated_bytes for s in steps)),
            "migrated_experts": int(sum(s.migrated_experts for s in steps)),
            "solve_s_mean": float(np.mean(upd)) if upd else 0.0,
            "solve_s_max": float(np.max(upd)) if upd else 0.0,
            "steps": [asdict(s) for s in steps]}


def replay(stream: RoutingTrace, policies: list[str], cfg: ReplayConfig, *,
           on_step: Callable[[str, StepFigures, Placement], None] | None = None) -> dict:
    """Replay `stream` under each of `policies` (module docstring); `on_step(name, figures,
    placement)` sees every step's placement (export, progress). Returns the `--json` object."""
    for name in policies:
        POLICIES.get(name)
    _, _, rows, starts = request_table(stream)
    R = starts.size - 1
    if R < cfg.window + 1:
        raise InputError(f"--window {cfg.window}: the stream has {R} requests; need more than "
                         "the window")
    bounds = list(range(cfg.window, R, cfg.every))
    if cfg.max_steps is not None:
        bounds = bounds[:cfg.max_steps]

    def part(a: int, b: int) -> RoutingTrace:
        return stream.take(rows[starts[a]:starts[b]])

    warm = part(0, cfg.window)
    t0 = time.perf_counter()
    starts_cache = {m: solve_window(m, warm, cfg) for m in
                    sorted({POLICIES.get(n).start for n in policies})}
    start_s = time.perf_counter() - t0
    out: dict = {"policies": {}}
    for name in policies:
        pol = POLICIES.get(name)
        p = starts_cache[pol.start]
        steps, layer_imb = [], []
        for s, a in enumerate(bounds):
            b = min(a + cfg.every, R)
            moved, dt = 0, 0.0
            if s > 0 and pol.update is not None:
                t0 = time.perf_counter()
                nxt = pol.update(p, part(max(0, a - cfg.span(pol)), a), cfg)
                dt = time.perf_counter() - t0
                moved = int(copied_experts(p, nxt).sum())
                p = nxt
            served = part(a, b)
            lar, imb = serve_figures(p, served.experts, cfg.rebalance.batch)
            fig = StepFigures(s, a, b - a, served.num_tokens, lar, float(imb.mean()),
                              float(imb.max()), moved, moved * cfg.rebalance.expert_bytes, dt)
            steps.append(fig)
            layer_imb.append(imb)
            if on_step is not None:
                on_step(name, fig, p)
        out["policies"][name] = {**summary(steps, layer_imb), "start": pol.start,
                                 "capabilities": {"full_layout": pol.full_layout,
                                                  "locality": pol.locality,
                                                  "budgeted": pol.budgeted}}
    out.update({"ep": cfg.ep, "every": cfg.every, "window": cfg.window, "requests": R,
                "steps": len(bounds), "start_solve_s": start_s,
                "expert_bytes": cfg.rebalance.expert_bytes,
                "rebalance": asdict(cfg.rebalance), "history": asdict(cfg.history),
                "max_imbalance": cfg.max_imbalance})
    return out
