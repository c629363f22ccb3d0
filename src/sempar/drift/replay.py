"""`sempar replay`: serve a stream step by step under each re-placement policy and measure it.

The stream's requests in arrival order: the first `window` requests are the warm-up every policy
starts from (its `start` solve); then steps of `every` requests. Before step s > 0 each policy
may update its placement from the last `window` requests served (`sempar-incremental`: and the
`history` windows before them, `ReplayConfig.span`); then the step's requests are
served on it. Per step and policy (`StepFigures`):

- `lar`: exact-home LAR of the step's requests (tp mode: `schedule.homes.oracle_home`, equal
  shares per batch, the rows' real experts; needs no token ids), an activation local when the
  copy the dispatch rule chose (`ReplayConfig.dispatch`, `placement.dispatch`; batches of
  `RebalanceConfig.batch` rows in arrival order) is on the token's home device;
- `imbalance`: per layer max / mean of the devices' served loads after dispatch, its mean
  over layers (`imbalance`) and its worst layer (`imbalance_max`);
- `migrated_bytes`: experts the update copied (`migration.copied_experts`) x the model's expert
  bytes; `solve_s`: the update's wall time.

Summary per policy: `lar_mean` (mean over steps), `imbalance_p95` (95th percentile over steps of
the step's mean-over-layers imbalance), `imbalance_layer_p95` (over every step and layer),
`migrated_bytes` (sum), `migrated_bytes_per_step` / `moves_per_step` (means over steps),
`updates` (steps before which the policy updated), `solve_s_mean` / `solve_s_max` (updates only).

An engine policy (`ReplayPolicy.cadence`) updates only at its engine's cadence, from its
engine's window (`drift.engines`); a policy unavailable here (an engine not installed) is
refused with its one-line reason before anything runs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from sempar.drift import engines
from sempar.drift.policies import POLICIES, ReplayConfig, ReplayPolicy, solve_window
from sempar.drift.streams import request_table
from sempar.errors import InputError
from sempar.placement.dispatch import DISPATCH, dispatch_all
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
    updated: bool = False


def serve_figures(p: Placement, experts: np.ndarray, batch: int, dispatch: str = "nearest",
                  seed: int = 0) -> tuple[float, np.ndarray]:
    """(exact-home LAR, per-layer imbalance float[L]) of `p` serving rows experts int[T, L, k]
    in batches of `batch` rows, each activation served by the copy `dispatch` chooses."""
    home = oracle_home(p, experts, batch)
    T, L, _ = experts.shape
    served = dispatch_all(p, experts, home, dispatch, np.arange(T) // max(batch, 1), seed)
    lar = float((served == home[:, :, None]).mean())
    G = p.num_devices
    key = np.arange(L)[None, :, None] * G + served
    load = np.bincount(key.ravel(), minlength=L * G).reshape(L, G).astype(float)
    return lar, load.max(axis=1) / np.maximum(load.mean(axis=1), 1e-12)


def check_policies(names: list[str]) -> list[ReplayPolicy]:
    """The registered policies of `names`; InputError with the one-line reason of the first
    that cannot run here."""
    out = [POLICIES.get(n) for n in names]
    for pol in out:
        why = pol.unavailable() if pol.unavailable is not None else None
        if why:
            raise InputError(why)
    return out


def _update_window(pol: ReplayPolicy, cfg: ReplayConfig, step: int) -> int | None:
    """Requests `pol`'s update before `step` sees, or None when it does not update then."""
    if step <= 0 or pol.update is None:
        return None
    cad = pol.cadence_of(cfg)
    if cad is None:
        return cfg.span(pol)
    if not engines.updates_at(cad, step, cfg.passes_per_step):
        return None
    return engines.window_requests(cad, cfg.every, cfg.passes_per_step)


def summary(steps: list[StepFigures], layer_imb: list[np.ndarray]) -> dict:
    upd = [s.solve_s for s in steps if s.updated]
    return {"lar_mean": float(np.mean([s.lar for s in steps])),
            "imbalance_p95": float(np.percentile([s.imbalance for s in steps], 95)),
            "imbalance_mean": float(np.mean([s.imbalance for s in steps])),
            "imbalance_layer_p95": float(np.percentile(np.concatenate(layer_imb), 95)),
            "migrated_bytes": float(sum(s.migrated_bytes for s in steps)),
            "migrated_experts": int(sum(s.migrated_experts for s in steps)),
            "migrated_bytes_per_step": float(np.mean([s.migrated_bytes for s in steps])),
            "moves_per_step": float(np.mean([s.migrated_experts for s in steps])),
            "solve_s_mean": float(np.mean(upd)) if upd else 0.0,
            "solve_s_max": float(np.max(upd)) if upd else 0.0,
            "steps": [asdict(s) for s in steps]}


def replay(stream: RoutingTrace, policies: list[str], cfg: ReplayConfig, *,
           on_step: Callable[[str, StepFigures, Placement], None] | None = None) -> dict:
    """Replay `stream` under each of `policies` (module docstring); `on_step(name, figures,
    placement)` sees every step's placement (export, progress). Returns the `--json` object."""
    DISPATCH.get(cfg.dispatch)
    check_policies(policies)
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
        steps, layer_imb, fallbacks = [], [], []
        for s, a in enumerate(bounds):
            b = min(a + cfg.every, R)
            moved, dt = 0, 0.0
            span = _update_window(pol, cfg, s)
            if span is not None:
                t0 = time.perf_counter()
                nxt = pol.update(p, part(max(0, a - span), a), cfg)
                dt = time.perf_counter() - t0
                moved = int(copied_experts(p, nxt).sum())
                if nxt.info.get("fallback"):         # the plug-in gave the engine's result
                    fallbacks.append(f"step {s}: {nxt.info['fallback']}")
                p = nxt
            served = part(a, b)
            lar, imb = serve_figures(p, served.experts, cfg.rebalance.batch, cfg.dispatch,
                                     cfg.solve.seed)
            fig = StepFigures(s, a, b - a, served.num_tokens, lar, float(imb.mean()),
                              float(imb.max()), moved, moved * cfg.rebalance.expert_bytes, dt,
                              span is not None)
            steps.append(fig)
            layer_imb.append(imb)
            if on_step is not None:
                on_step(name, fig, p)
        cad = pol.cadence_of(cfg)
        out["policies"][name] = {**summary(steps, layer_imb), "start": pol.start,
                                 "updates": int(sum(f.updated for f in steps)),
                                 "fallbacks": fallbacks,
                                 "cadence": None if cad is None else asdict(cad),
                                 "capabilities": {"full_layout": pol.full_layout,
                                                  "locality": pol.locality,
                                                  "budgeted": pol.budgeted}}
    out.update({"ep": cfg.ep, "every": cfg.every, "window": cfg.window, "requests": R,
                "steps": len(bounds), "start_solve_s": start_s,
                "expert_bytes": cfg.rebalance.expert_bytes,
                "rebalance": asdict(cfg.rebalance), "history": asdict(cfg.history),
                "max_imbalance": cfg.solve.max_imbalance, "redundant": cfg.redundant,
                "dispatch": cfg.dispatch, "engine": cfg.engine,
                "passes_per_step": cfg.passes_per_step})
    return out
