"""Serving forecasts from a routing trace: one deployment (`Prepared`) = a system variant on G
devices of a topology and accelerator; `compare` sweeps request rates over several systems and
finds the throughput each sustains under the SLOs (`sempar serve-sim`).

Protocol (Sem-MoE §5, s-MoE §5): the trace is split by request, 20% to fit the placements and
schedulers, 80% replayed (routing of the iterations' tokens, request ranks, `trace` lengths).
Every system sees the same arrivals at a given rate: one unit-rate stream per seed, scaled by the
rate (workload.stable_arrivals). Throughput under each SLO is searched on the rate: the grid
brackets it, bisection narrows it to a stated tolerance (slo_search.py); the curves keep the grid.

SLOs, per attention mode: each paper judges systems against the baseline of its own attention
mode -- Sem-MoE's DP systems against SGLang (DP), s-MoE's TP systems against DeepSpeed-MoE (TP)
-- with the SLO at `slo_scale` x that baseline's latency under the lightest load. So here the
first system named with an Attention-DP variant is the DP baseline and the first with an
Attention-TP variant the TP baseline (with the default order: `sglang` and `semmoe-tp`); the
lightest load is the lowest swept rate, and each system (each variant of `sempar`) is judged
against the SLOs of its own mode (metrics.py). Given SLOs (`--slo`) apply to both modes. A TP
instance spreads one batch over G devices, so its light-load latency differs from a DP rank's;
judging it by the DP baseline's SLOs would score the mode, not the system. (`sempar plan`
instead ranks every deployment, DP or TP, against one SLO: the user's question there is which
mode to deploy under one latency requirement.) `sempar`'s reported variant is the one with the
higher throughput under its own mode's E2E SLO. Arrivals stop at `duration`; the
run then drains until 2 x `duration`, and what is still unfinished counts as infinitely late.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from sempar.comm.homes import Homes
from sempar.comm.pipelines import PIPELINES
from sempar.comm.simulate import SimOptions
from sempar.comm.topology import Topology
from sempar.bounds import check_requests
from sempar.errors import InputError
from sempar.serving.dims import ModelDims
from sempar.serving.engine import EngineConfig, run
from sempar.serving.hardware import Accelerator
from sempar.serving.metrics import SLO_KEYS, SLOSpec, run_metrics, slos_from
from sempar.serving.roofline import Roofline
from sempar.serving.steptable import StepTable, sample_steps
from sempar.serving.systems import Variant, resolve
from sempar.serving.slo_search import SearchConfig, search
from sempar.serving.workload import WorkloadSpec, make_workload, stable_arrivals
from sempar.solve_options import SolveOptions
from sempar.trace.schema import RoutingTrace

DRAIN = 2.0         # horizon = DRAIN x duration


@dataclass
class Prepared:
    variant: Variant
    cfg: EngineConfig
    roofline: Roofline
    table: StepTable
    request_tokens: np.ndarray      # int64[Rt] token count of each replayed request
    request_rank: np.ndarray        # int32[Rt] its Attention-DP rank (0 under TP)
    slots_per_device: int

    def step_seconds(self, prefill, decode, attn_ctx, kv_read, sampled, i) -> float:
        """The execution-time predictor (engine.Predictor): roofline compute + tabulated
        experts and communication, float64[K]."""
        n = prefill.sum(axis=-1) + decode.sum(axis=-1)
        comm, expert = self.table.lookup(float(n[0]) if (n == n[0]).all() else n, i)
        return self.roofline.dense_seconds(prefill, decode, attn_ctx, kv_read, sampled) + comm + expert

    def capacity(self, input_len: int, output_len: int) -> float:
        """Requests/s at a full iteration (every instance at its budget, half of it decoding);
        only for choosing default rates."""
        I, B = self.cfg.instances, self.cfg.budget
        dec = min(self.cfg.max_running, B // 2)
        z = np.zeros((1, I))
        ctx = input_len + output_len / 2
        pre = np.full((1, I), B - dec, np.float64)
        dt = (float(self.roofline.dense_seconds(pre, z + dec, pre * input_len / 2 + dec * ctx,
                                                pre * input_len / 2 + dec * ctx, z + dec)[0])
              + sum(self.table.mean(I * B)))
        per_req = I * B / dt / (input_len + output_len)
        return float(per_req)

    def config(self) -> dict:
        v = self.variant
        tp = self.roofline.tp
        policy = ("rebatch" if v.schedule != "none" else "contiguous") if tp else v.policy
        return {"placement": v.placement, "pipeline": v.pipeline, "policy": policy,
                "schedule": v.schedule, "redundant": v.redundant_slots(self.roofline.G),
                "attention": "tp" if self.roofline.tp else "dp", "instances": self.cfg.instances,
                "token_budget": self.cfg.budget, "max_running": self.cfg.max_running,
                "kv_capacity_tokens": self.cfg.kv_capacity, "lar": self.table.lar}


def home_rule(pipe, v: Variant) -> str:
    """How deployment `v` on pipeline `pipe` homes tokens (`solve_options.HOME_RULES`), which
    its placement is solved for: `smoe-exact`'s pre-routing -> exact; the online schedulers
    (`comm.homes.Homes`: tp re-batching, an Attention-DP request policy) -> table; otherwise
    the request's DP rank or the batch chunk -> positions."""
    if pipe.name == "smoe-exact":
        return "exact"
    return "table" if pipe.scheduled and v.schedule != "none" else "positions"


class Forecaster:
    """Caches the split, placements and homes for one trace, topology and accelerator."""

    def __init__(self, trace: RoutingTrace, dims: ModelDims, topo: Topology, acc: Accelerator,
                 budget: int = 2048, max_running: int = 128,
                 options: SolveOptions | None = None, sim: dict | None = None,
                 solve_rows: dict[str, int] | None = None):
        """options: the user's solve options (None: the defaults), passed whole to every
        placement solve with the variant's replicas and the topology's nodes set; its seed also
        draws the 20/80 split and the arrivals. sim: SimOptions fields over the pipeline
        defaults for every deployment (e.g. the runtime's dedup / one-shot / size exchanges and
        `collectives`, benchcheck.py). solve_rows: {method: N}: that method solves on whole
        requests of the fit split, drawn in a seeded order while they total at most N rows (a
        time budget: the demo's `sempar` on DeepSeek-V2-Lite), said in the placement's info
        (`solved_on_rows`)."""
        from sempar.trace.ops import split_by_request

        m = trace.meta
        if (dims.num_experts, dims.top_k, dims.moe_layers) != (m.num_experts, m.top_k, m.num_layers):
            raise InputError(f"--preset {dims.name}: {dims.moe_layers} MoE layers x "
                             f"{dims.num_experts} experts, top-{dims.top_k}; the trace has "
                             f"{m.num_layers} x {m.num_experts}, top-{m.top_k}")
        if budget < 1 or max_running < 1 or budget < max_running:
            raise InputError("--token-budget and --max-running must be positive, budget >= running")
        self.options = options or SolveOptions()
        self.dims, self.topo, self.acc, self.seed = dims, topo, acc, self.options.seed
        self.budget, self.max_running = budget, max_running
        self.solve_rows = dict(solve_rows or {})
        self.sim = dict(sim or {})
        if self.sim.get("collectives") is None and topo.collectives is None \
                and topo.links is not None:
            # a topology built from links (the presets): all-to-all pairs share them
            # (collective_models `nccl-links`); eq. 9 alone priced sglang-ep's all-to-all on
            # pcie-upi8 ~10x too cheap (docs/serving.md, "The Attention-TP gap")
            self.sim["collectives"] = "nccl-links"
        self.fit, self.eval = split_by_request(trace, 0.2, seed=self.seed)
        self._placements: dict = {}
        self.dispatch: str | None = None   # the replicas' dispatch rule (serve-sim --dispatch)
        self._homes: dict = {}
        self._served: dict = {}         # DP homes under the served lengths (ranks.py)
        self._steps: dict = {}          # simulated step-table batches per deployment (prepare)
        _, first, counts = np.unique(self.eval.request_id, return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        self._req_first, self._req_tokens = first[order], counts[order].astype(np.int64)

    @property
    def G(self) -> int:
        return self.topo.num_devices

    def share_placements(self, other: "Forecaster") -> None:
        """Use `other`'s placement cache: the same trace split and solve options on the same
        devices and nodes solve to the same placements, whatever the links (a topology of equal
        shape)."""
        if other is self:
            return
        if (other.options, other.G, other.topo.num_nodes) != \
                (self.options, self.G, self.topo.num_nodes) \
                or other.fit.num_tokens != self.fit.num_tokens:
            raise ValueError("share_placements: another split or device layout")
        self._placements = other._placements

    def placement(self, method: str, redundant: int, homes: str | None = None):
        """`method`'s placement with `redundant` replica slots, solved with the forecaster's
        options for the home rule `homes` (None: the options' own; `home_rule` of a variant),
        so that `sempar`'s objective serves the deployment (`SolveOptions.items`); solves that
        come out the same (same objective) are shared."""
        from sempar.placement import solve

        options = replace(self.options, num_nodes=self.topo.num_nodes, redundant=redundant,
                          homes=homes or self.options.homes)
        key = (method, redundant, options.items(self.fit.meta.has_token_ids))
        if key not in self._placements:
            fit, cap = self.fit, self.solve_rows.get(method)
            if cap is not None and fit.num_tokens > cap:
                # whole requests in a seeded random order (the trace's requests are grouped
                # by domain: the first ones alone would be one domain) while they fit in cap
                req, counts = np.unique(fit.request_id, return_counts=True)
                order = np.random.default_rng([self.seed, 7]).permutation(req.size)
                take = order[np.cumsum(counts[order]) <= cap]
                fit = fit.take(np.isin(fit.request_id, req[take if take.size else order[:1]]))
            self._placements[key] = solve(method, fit, num_devices=self.G, options=options)
            if self.dispatch is not None and redundant:   # served after dispatch (steptable)
                self._placements[key].info["dispatch"] = self.dispatch
            if fit is not self.fit:
                self._placements[key].info["solved_on_rows"] = int(fit.num_tokens)
        return self._placements[key]

    def placement_for(self, v: Variant):
        """The placement deployment `v` runs: its method and replicas, solved for its homes."""
        return self.placement(v.placement, v.redundant_slots(self.G),
                              home_rule(PIPELINES.get(v.pipeline), v))

    def prepare(self, v: Variant, sample_tokens: int | None = None,
                served: tuple[str, int, int] | None = None, screen: bool = False) -> Prepared:
        """The deployment of variant `v`; `sample_tokens` (default steptable.SAMPLE_TOKENS)
        tokens are drawn per batch-size bucket. `served` = (lengths, input_len, output_len) of
        the runs to come: an Attention-DP request policy then ranks the requests by the tokens
        the simulation serves for them (ranks.py), and their tokens' homes follow; without it
        the policy sees the trace's lengths. `screen`: the step table holds the full-budget
        bucket alone, enough for `Prepared.capacity` (the plan's screen), not for a run.
        The simulated batches of a full table are cached per deployment (`_steps`, shared
        with `sensitivity.scaled` copies, whose compute scale only re-prices them)."""
        pipe = PIPELINES.get(v.pipeline)
        G = self.G
        pl = self.placement_for(v)
        hk = (v.placement, v.redundant_slots(G), v.schedule, v.policy)
        if hk not in self._homes:
            self._homes[hk] = Homes(pl, self.eval, self.fit, v.schedule, v.policy)
        homes = self._homes[hk]
        tp = pipe.attention == "tp"
        if served is not None and not tp and pipe.expert_parallel and homes.scheduled(pipe):
            home = self._served_homes(hk, pl, v.policy, served)
        else:
            home = homes(pipe)
        roof = Roofline(self.dims, self.acc, G, tp=tp)
        inst = 1 if tp else G
        scale = G if tp else 1
        cap = roof.kv_capacity(pl.slots_per_device)
        if cap < 1:
            raise InputError(f"{v.label()}: the weights do not fit in {self.acc.name} memory at EP {G}")
        cfg = EngineConfig(inst, self.budget * scale, self.max_running * scale, cap)
        opts = SimOptions(**{"hidden": self.dims.hidden, "dtype_bytes": self.dims.dtype_bytes,
                             **self.sim})
        key = (v, sample_tokens, served)
        steps = None if screen else self._steps.get(key)
        if steps is None:
            steps = sample_steps(self.eval.experts, home, pl, self.topo, pipe, opts,
                                 cfg.budget * inst, seed=self.seed, sample_tokens=sample_tokens,
                                 top_only=screen)
            if not screen:
                self._steps[key] = steps
        table = steps.table(roof)
        rank = (home[self._req_first, 0] if (home is not None and not tp)
                else np.zeros(self._req_first.size, np.int32))
        return Prepared(v, cfg, roof, table, self._req_tokens, np.asarray(rank, np.int32),
                        pl.slots_per_device)

    def _served_homes(self, hk: tuple, pl, policy: str, served: tuple[str, int, int]) -> np.ndarray:
        """int32[T, L]: each eval token on the DP rank `policy` gives its request when requests
        hold their served lengths (cached per placement, policy and lengths)."""
        from sempar.schedule.homes import home_from_ranks
        from sempar.serving.ranks import policy_ranks, served_lengths

        key = (*hk, *served)
        if key not in self._served:
            n = served_lengths(self._req_tokens, *served)
            ranks = policy_ranks(pl, self.fit, self.eval, policy, n)
            self._served[key] = home_from_ranks(self.eval.request_id, ranks, self.eval.meta.num_layers)
        return self._served[key]

    def run_rate(self, p: Prepared, rate: float, duration: float, lengths: str, input_len: int,
                 output_len: int, arrivals: np.ndarray | None = None, stream: int = 0) -> dict:
        """Metrics of `p` at `rate`: arrivals from `stream` (one unit-rate stream per seed and
        stream, scaled by the rate: workload.stable_arrivals), or the given `arrivals`."""
        arr = (arrivals if arrivals is not None
               else stable_arrivals(rate, duration, [self.seed, stream]))
        rng = np.random.default_rng([self.seed, stream, 1])         # lengths (`exp`)
        w = make_workload(arr, lengths, input_len, output_len, p.request_tokens, p.request_rank, rng)
        log = run(w, p.cfg, p.step_seconds, DRAIN * duration)
        m = run_metrics(w, log, duration)
        m["rate"] = float(rate)
        return m

    def under_slo(self, p: Prepared, grid: list[dict], slos: dict, targets: dict, duration: float,
                  lengths: str, input_len: int, output_len: int,
                  cfg: SearchConfig = SearchConfig(), stream: int = 0) -> tuple[dict, list[dict]]:
        """Throughput under each target's SLOs: the grid `grid` (this deployment's curve)
        bracketed, then bisected on the rate (slo_search.search)."""
        return search(lambda r: self.run_rate(p, r, duration, lengths, input_len, output_len,
                                              stream=stream), grid, slos, targets, cfg)


def default_rates(prepared: list[Prepared], input_len: int, output_len: int, n: int = 10) -> list[float]:
    """n rates from 5% to 120% of the largest estimated capacity (2 significant digits)."""
    cap = max(p.capacity(input_len, output_len) for p in prepared)
    return [float(f"{cap * f:.2g}") for f in np.linspace(0.05, 1.2, n)]


def clean(x):
    """JSON-safe: non-finite floats become None."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x


def attention(p: Prepared) -> str:
    """"tp" or "dp": the attention mode of a deployment."""
    return "tp" if p.roofline.tp else "dp"


def mode_baselines(plans: dict[str, list[Prepared]], curves: dict[str, list[list[dict]]]
                   ) -> dict[str, tuple[str, list[dict]]]:
    """{attention mode: (system, curve)}: the first system named with a variant of that mode,
    and that variant's curve (its lowest rate is the mode's lightest load)."""
    out: dict = {}
    for name, ps in plans.items():
        for p, pts in zip(ps, curves[name]):
            out.setdefault(attention(p), (name, pts))
    return out


def compare(fc: Forecaster, systems: list[str], load: WorkloadSpec = WorkloadSpec(),
            slo: SLOSpec = SLOSpec(), progress=None,
            search_cfg: SearchConfig = SearchConfig()) -> dict:
    """Curves, SLOs and throughput under each SLO for every system (serve-sim's JSON): each
    system's grid curve over `load`'s rates (or its one arrival file), then the rate searched
    per SLO key (slo_search.py); SLOs at `slo.scale` x each attention mode's baseline at the
    lightest load, or `slo.given`."""
    t0 = time.perf_counter()
    rates, duration, arrivals = load.rates, load.duration, load.arrivals
    lengths, input_len, output_len = load.io
    slo_scale, slo_given = slo.scale, slo.given
    if duration <= 0:
        raise InputError(f"--duration: {duration} is not positive")
    if slo_scale <= 0:
        raise InputError(f"--slo-scale: {slo_scale} is not positive")
    plans = {}
    for name in systems:
        sysm = resolve(name)
        plans[name] = []
        for v in sysm.variants:
            if progress:
                progress(f"prepare {name} ({v.label()})")
            plans[name].append(fc.prepare(v, served=(lengths, input_len, output_len)))
    if arrivals is not None:                # one point: the file's requests over its span
        duration = max(duration, float(arrivals[-1]))
        rates = [arrivals.size / duration]
    elif rates is None:
        rates = default_rates([p for ps in plans.values() for p in ps], input_len, output_len,
                              load.n_rates)
    if any(r <= 0 for r in rates):
        raise InputError("--rates must be positive")
    check_requests(rates, duration)         # default rates too: before any rate is simulated
    rates = sorted(rates)
    curves = {}
    for name, ps in plans.items():
        curves[name] = []
        for p in ps:
            pts = []
            for r in rates:
                if progress:
                    progress(f"{name} ({p.variant.label()}) at {r:g} req/s")
                pts.append(fc.run_rate(p, r, duration, lengths, input_len, output_len, arrivals))
            curves[name].append(pts)
    base = mode_baselines(plans, curves)
    by_mode = {m: slos_from(pts[0], slo_scale, slo_given) for m, (_, pts) in base.items()}
    first = attention(plans[systems[0]][0])
    out = {}
    for name, ps in plans.items():
        scored = []
        for p, pts in zip(ps, curves[name]):
            slos = by_mode[attention(p)]
            if arrivals is None:            # the rate is ours to vary: search it
                if progress:
                    progress(f"{name} ({p.variant.label()}): search the rate under each SLO")
                found, extra = fc.under_slo(p, pts, slos, {k: (k,) for k in SLO_KEYS}, duration,
                                            lengths, input_len, output_len, search_cfg)
            else:                           # one given arrival file: its one point
                found, extra = search(lambda r: {}, pts, slos, {k: (k,) for k in SLO_KEYS},
                                      SearchConfig(max_steps=0, extend=0)), []
            att = {"max_rate_under_slo": {k: f["rate"] for k, f in found.items()},
                   "throughput_under_slo": {k: f["throughput"] for k, f in found.items()},
                   "search": found, "search_points": extra}
            key = tuple((att["throughput_under_slo"][k] or 0.0) for k in ("e2e", "ttft"))
            scored.append((key, p, pts, att))
        _, p, pts, att = max(scored, key=lambda s: s[0])
        m = attention(p)
        entry = {"config": p.config(), "description": resolve(name).description,
                 "notes": list(p.variant.notes), "slo_baseline": base[m][0],
                 "slos": by_mode[m], **att, "curve": pts}
        if len(ps) > 1:
            entry["variants"] = {q.variant.label(): a["throughput_under_slo"] for _, q, _, a in scored}
        out[name] = entry
    return clean({"model": fc.dims.name, "topology": fc.topo.name, "accelerator": fc.acc.name,
                  "ep": fc.G, "duration": duration, "lengths": lengths, "input_len": input_len,
                  "output_len": output_len, "rates": rates, "baseline": systems[0],
                  "light_load": base[first][1][0], "slo_scale": slo_scale, "slos": by_mode[first],
                  "slo_baselines": {m: b[0] for m, b in base.items()}, "slos_by_attention": by_mode,
                  "slos_given": sorted(slo_given or {}),
                  "search": {"tolerance": search_cfg.tolerance, "max_steps": search_cfg.max_steps},
                  "systems": out, "wall_seconds": time.perf_counter() - t0})
