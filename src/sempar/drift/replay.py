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
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np

from sempar.drift import engines
from sempar.drift.events import detect, request_histograms
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
    events: int = 0                   # updates inside the step (`drift.events`)


def serve_loads(p: Placement, experts: np.ndarray, batch: int, dispatch: str = "nearest",
                seed: int = 0, offset: int = 0) -> tuple[int, np.ndarray]:
    """(activations served on their exact home device, served load float64[L, G]) of `p`
    serving rows experts int[T, L, k] in batches of `batch` rows (row i in batch
    (offset + i) // batch: a step served in parts keeps the step's batches), each activation
    served by the copy `dispatch` chooses."""
    home = oracle_home(p, experts, batch)
    T, L, _ = experts.shape
    served = dispatch_all(p, experts, home, dispatch, (offset + np.arange(T)) // max(batch, 1),
                          seed)
    G = p.num_devices
    key = np.arange(L)[None, :, None] * G + served
    load = np.bincount(key.ravel(), minlength=L * G).reshape(L, G).astype(float)
    return int((served == home[:, :, None]).sum()), load


def serve_figures(p: Placement, experts: np.ndarray, batch: int, dispatch: str = "nearest",
                  seed: int = 0) -> tuple[float, np.ndarray]:
    """(exact-home LAR, per-layer imbalance float[L]) of `p` serving rows experts int[T, L, k]
    in batches of `batch` rows, each activation served by the copy `dispatch` chooses."""
    local, load = serve_loads(p, experts, batch, dispatch, seed)
    return local / max(experts.size, 1), load.max(axis=1) / np.maximum(load.mean(axis=1), 1e-12)


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


class _EventState:
    """The switch test's state over one policy's replay (`drift.events`): the request after the
    layout's last update (`last`), the start of the young regime (`start`, None when there is
    none or it is a window old), and the event update's config (`cfg`: the event budget)."""

    def __init__(self, cfg: ReplayConfig, first: int):
        e = cfg.events
        self.window, self.e, self.last, self.start = cfg.window, e, first, None
        self.pre = cfg.window * cfg.history.windows        # requests seen before a regime
        self.rng = np.random.default_rng(e.seed)
        self.cfg = cfg.with_(rebalance=replace(cfg.rebalance, max_moves=e.max_moves),
                             replicas=replace(cfg.replicas, max_moves=e.replica_moves))

    def regime(self, a: int) -> int | None:
        """Requests of the young regime before request a, or None (none, or a window old)."""
        if self.start is not None and a - self.start >= self.window:
            self.start = None
        return None if self.start is None else a - self.start

    def check(self, hist: np.ndarray, r: int) -> bool:
        """After serving request r: whether to update now (a switch found, or the young regime
        reached 2, 4, 8, ... requests); sets `start`."""
        n = self.regime(r + 1)
        if n is not None and self.e.regrow and n > 1 and n & (n - 1) == 0 and r + 1 > self.last:
            return True
        c = detect(hist, r, r + 1 - self.last, self.window, self.e, self.rng)
        if c:
            self.start = r - c + 1
        return bool(c)


def _warm_update(pol: ReplayPolicy, p: Placement, warm: RoutingTrace,
                 cfg: ReplayConfig) -> tuple[Placement, int, float]:
    """(`p` updated once on the warm-up window, experts it copied, seconds): `cfg.warm_start`,
    at the event budget (`Events.max_moves` moves) with `cfg.warm_replica_moves` replica slots
    per layer free (None: all R). Counted in step 0's migration and update time."""
    k = cfg.redundant if cfg.warm_replica_moves is None else cfg.warm_replica_moves
    wc = cfg.with_(rebalance=replace(cfg.rebalance, max_moves=cfg.events.max_moves),
                   replicas=replace(cfg.replicas, max_moves=k),
                   replica_resamples=cfg.young_resamples)
    t0 = time.perf_counter()
    nxt = pol.update(p, warm, wc)
    return nxt, int(copied_experts(p, nxt).sum()), time.perf_counter() - t0


def _young_config(cfg: ReplayConfig) -> ReplayConfig:
    """The config of a step update while the stream is younger than the history's span
    (`ReplayConfig.young_budget`): the event budget, the bound `young_cap` where set."""
    cap = cfg.rebalance.max_imbalance if cfg.young_cap is None else cfg.young_cap
    return cfg.with_(rebalance=replace(cfg.rebalance, max_moves=cfg.events.max_moves,
                                       max_imbalance=cap),
                     replicas=replace(cfg.replicas, max_moves=cfg.events.replica_moves),
                     replica_resamples=cfg.young_resamples)


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
            "events": int(sum(s.events for s in steps)),
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
    hist = None
    for name in policies:
        pol = POLICIES.get(name)
        p = starts_cache[pol.start]
        steps, layer_imb, fallbacks = [], [], []
        ev = _EventState(cfg, bounds[0]) if pol.events and cfg.events.enabled else None
        if ev is not None and hist is None:
            hist = request_histograms(stream)
        young = _young_config(cfg) if ev is not None and cfg.young_budget else None
        warm_moved, warm_s = 0, 0.0
        if cfg.warm_start and pol.history and pol.update is not None:
            p, warm_moved, warm_s = _warm_update(pol, p, warm, cfg)
        for s, a in enumerate(bounds):
            b = min(a + cfg.every, R)
            moved, dt, n_events = (warm_moved, warm_s, 0) if s == 0 else (0, 0.0, 0)

            def update(lo: int, hi: int, regime: int | None) -> None:
                nonlocal p, moved, dt
                t0 = time.perf_counter()
                if regime is None and lo < 0 and young is not None:   # a young stream
                    nxt = pol.update(p, part(0, hi), young)
                elif regime is None:
                    nxt = pol.update(p, part(max(0, lo), hi), cfg)
                else:                # a young regime (`drift.events`): the event budget
                    nxt = pol.update(p, part(max(0, lo), hi), ev.cfg, regime=regime)
                dt += time.perf_counter() - t0
                moved += int(copied_experts(p, nxt).sum())
                if nxt.info.get("fallback"):         # the plug-in gave the engine's result
                    fallbacks.append(f"step {s}: {nxt.info['fallback']}")
                p = nxt

            span = _update_window(pol, cfg, s)
            if span is not None:
                regime = ev.regime(a) if ev is not None else None
                update(a - span if regime is None else a - regime - ev.pre, a, regime)
                if ev is not None:
                    ev.last = a
            # serve the step; with the switch test, in parts split where it updated
            local, load, pos = 0, 0.0, a

            def serve_to(hi: int) -> None:
                """Serve requests [pos, hi) on the current layout, in the step's batches."""
                nonlocal local, load, pos
                x, y = serve_loads(p, part(pos, hi).experts, cfg.rebalance.batch, cfg.dispatch,
                                   cfg.solve.seed, starts[pos] - starts[a])
                local, load, pos = local + x, load + y, hi

            for r in range(a, b - 1) if ev is not None else ():
                if ev.check(hist, r):
                    serve_to(r + 1)
                    update(ev.start - ev.pre, r + 1, r + 1 - ev.start)
                    ev.last, n_events = r + 1, n_events + 1
            if ev is not None:
                ev.check(hist, b - 1)        # the test's state (`start`) sees every request
            serve_to(b)
            acts = (starts[b] - starts[a]) * stream.experts.shape[1] * stream.experts.shape[2]
            imb = load.max(axis=1) / np.maximum(load.mean(axis=1), 1e-12)
            fig = StepFigures(s, a, b - a, int(starts[b] - starts[a]), local / max(acts, 1),
                              float(imb.mean()), float(imb.max()), moved,
                              moved * cfg.rebalance.expert_bytes, dt, span is not None,
                              n_events)
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
    out.update({"events": asdict(cfg.events), "ep": cfg.ep, "every": cfg.every,
                "window": cfg.window, "requests": R,
                "steps": len(bounds), "start_solve_s": start_s,
                "expert_bytes": cfg.rebalance.expert_bytes,
                "rebalance": asdict(cfg.rebalance), "history": asdict(cfg.history),
                "max_imbalance": cfg.solve.max_imbalance, "redundant": cfg.redundant,
                "dispatch": cfg.dispatch, "engine": cfg.engine,
                "passes_per_step": cfg.passes_per_step})
    return out
