"""`sempar plan`: rank deployments -- pipeline x placement method x request policy x redundant
slots x EP size -- by forecast throughput under an SLO, and say how to deploy the winner.

Two stages, because a full rate sweep per candidate is the expensive part:

1. screen: every candidate that fits memory is prepared with a coarse step table (SCREEN_TOKENS
   tokens per bucket) and scored by its saturated capacity (forecast.Prepared.capacity);
2. forecast: the `top` best are prepared in full and swept over the same rates; each one's
   throughput under the SLO is searched on the rate (slo_search.py: the grid brackets it,
   bisection narrows it) for every SLO key given together (default: TTFT and E2E, Sem-MoE's
   pair), with the SLOs at 5x the lightest load of SGLang's baseline (vanilla placement,
   round-robin, sglang-ep) on the first EP size unless given;
3. choose: ranked by that figure; the forecast's noise is the spread of the leader's and the
   baseline's figure over `noise_streams` other arrival streams (at least the search's
   tolerance), and among the deployments within it of the leader the simplest is recommended
   (choose.py), which the result says.

Candidates come from the registries (placement SOLVERS, comm PIPELINES), so a solver or pipeline
registered later is planned for without a change here. Attention-DP pipelines take the request
policies `DEFAULT_POLICIES` or any of REQUEST_POLICIES named by `--policies` (round-robin with
vanilla homes, the others with the online schedulers; the printed deployment then includes the
`sempar router` line); Attention-TP pipelines re-batch when they can (`pipeline.scheduled`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sempar.comm.pipelines import PIPELINES
from sempar.bounds import check_requests
from sempar.errors import InputError
from sempar.serving.choose import choose
from sempar.serving.deploy import commands, complexity
from sempar.serving.forecast import clean, default_rates
from sempar.serving.metrics import SLOSpec
from sempar.serving.accel_profile import compute_model
from sempar.serving.sensitivity import SCALES, compute_sensitivity
from sempar.serving.slo_search import SearchConfig
from sempar.serving.systems import Variant
from sempar.serving.workload import WorkloadSpec

BASELINE = Variant("vanilla", "sglang-ep")      # SGLang's EP launch: id-order experts, round-robin

SCREEN_TOKENS = 2048
DEFAULT_METHODS = ("vanilla", "eplb", "moetuner", "exflow", "semmoe", "smoe-cem", "sempar")


DEFAULT_PIPELINES = ("sglang-ep", "exflow", "ds-moe", "smoe", "smoe-exact")
# The request policies tried by default: the ones plan ranked before the router's load-aware
# policies joined the registry (`--policies` names any registered one).
DEFAULT_POLICIES = ("round-robin", "alg2", "balanced")


def candidates(methods=None, pipelines=None, policies=None, redundant=(0,)) -> list[Variant]:
    from sempar.placement import SOLVERS
    methods = [m for m in (methods or DEFAULT_METHODS) if m in SOLVERS]
    pipes = pipelines or [p for p in DEFAULT_PIPELINES if p in PIPELINES]
    for p in pipes:
        PIPELINES.get(p)
    out = []
    for pname in pipes:
        pipe = PIPELINES.get(pname)
        if pipe.attention == "dp":
            pols = [(p, "none" if p == "round-robin" else "online")
                    for p in (policies or DEFAULT_POLICIES)]
        else:
            pols = [("alg2", "online" if pipe.scheduled else "none")]
        for m in methods:
            for pol, sched in pols:
                for r in redundant:
                    out.append(Variant(m, pname, pol, sched, str(r)))
    return out


@dataclass(frozen=True)
class PlanOptions:
    """What `plan` compares and how hard it looks: the candidate space (`methods`,
    `pipelines`, `policies`: None = the defaults above; `redundant` slot counts or "G"), the
    `top` screened candidates forecast in full (with `per_pipeline`, the best of every
    pipeline too), the rate search, the arrival streams the noise is measured on, the gain's
    `attribution` and the compute `sensitivity` scales (() for none)."""

    top: int = 4
    methods: tuple[str, ...] | None = None
    pipelines: tuple[str, ...] | None = None
    policies: tuple[str, ...] | None = None
    redundant: tuple = (0,)
    search: SearchConfig = SearchConfig()
    noise_streams: int = 1
    attribute: bool = False
    per_pipeline: bool = False
    sensitivity: tuple[float, ...] = SCALES


def plan(make_fc, eps: list[int], trace_path: str, load: WorkloadSpec = WorkloadSpec(),
         slo: SLOSpec = SLOSpec(), opts: PlanOptions = PlanOptions(), progress=None) -> dict:
    """make_fc(ep) -> Forecaster for that EP size; `load` what is served (its rates, or
    `n_rates` default ones), `slo` the SLO (given keys replace its `keys`). Returns the ranked
    deployments: each one's throughput under the SLO searched on the rate (slo_search.py), the
    forecast's noise, and the choice (choose.py); with `opts.attribute`, what the recommended
    deployment's gain is made of (`attribution`); with `opts.per_pipeline`, the best screened
    deployment of every pipeline is forecast in full too (beside the `top`), so pipelines are
    compared under the SLO, not only by the screen's capacity estimate; `opts.sensitivity`:
    compute scales at which the recommended deployment's gain is forecast again
    (sensitivity.py)."""
    t0 = time.perf_counter()
    search_cfg, duration = opts.search, load.duration
    input_len, output_len = load.input_len, load.output_len
    methods, pipelines, policies = opts.methods, opts.pipelines, opts.policies
    redundant, top, per_pipeline = list(opts.redundant), opts.top, opts.per_pipeline
    fcs = {G: make_fc(G) for G in eps}
    served = ("fixed", input_len, output_len)      # DP policies rank by the served lengths
    methods = list(methods) if methods else None
    pipelines = list(pipelines) if pipelines else None
    policies = list(policies) if policies else None
    screened, skipped = [], []
    for G, fc in fcs.items():
        for v in candidates(methods, pipelines, policies, redundant):
            if progress:
                progress(f"screen EP {G}: {v.label()} r={v.redundant}")
            try:
                p = fc.prepare(v, sample_tokens=SCREEN_TOKENS, served=served, screen=True)
            except InputError as e:
                skipped.append({"ep": G, **_row(v, G), "reason": str(e)})
                continue
            screened.append((p.capacity(input_len, output_len), G, v))
    if not screened and not skipped:
        raise InputError("plan: --methods x --pipelines x --policies x --redundant name no "
                         "deployment")
    if not screened:
        raise InputError("plan: no deployment fits: " + "; ".join(s["reason"] for s in skipped[:3]))
    screened.sort(key=lambda s: -s[0])
    best = screened[:top]
    if per_pipeline:
        seen = {v.pipeline for _, _, v in best}
        for sc in screened:
            if sc[2].pipeline not in seen:
                seen.add(sc[2].pipeline)
                best.append(sc)
    full = []
    for _, G, v in best:
        if progress:
            progress(f"forecast EP {G}: {v.label()}")
        full.append((G, v, fcs[G].prepare(v, served=served)))
    base_fc = fcs[eps[0]]
    base = base_fc.prepare(BASELINE, served=served)
    rates = sorted(load.rates or default_rates([p for _, _, p in full] + [base], input_len,
                                               output_len, load.n_rates))
    check_requests(rates, duration)         # default rates too: before any rate is simulated
    light = base_fc.run_rate(base, rates[0], duration, "fixed", input_len, output_len)
    slos = slo.slos(light)
    keys = tuple(slo.given) or tuple(slo.keys)
    io = ("fixed", input_len, output_len)

    def forecast(fc, p, stream=0):
        return _forecast(fc, p, rates, slos, keys, duration, io, search_cfg, stream)

    entries = []
    for G, v, p in full:
        if progress:
            progress(f"sweep and search EP {G}: {v.label()}")
        curve, found, extra = forecast(fcs[G], p)
        entries.append(({**_row(v, G), "lar": p.config()["lar"], **found,
                         "capacity_estimate": p.capacity(input_len, output_len),
                         "complexity": complexity(v, G),
                         "commands": commands(v, G, fcs[G].topo.num_nodes, trace_path,
                                              fcs[G].dims.name, fcs[G].placement_for(v),
                                              fcs[G].seed),
                         "curve": curve, "search_points": extra}, G, v, p))
    entries.sort(key=lambda e: -(e[0]["throughput_under_slo"] or 0.0))
    ranked = [e[0] for e in entries]
    if progress:
        progress("sweep and search: SGLang's baseline")
    base_curve, bf, base_extra = forecast(base_fc, base)
    # the forecast's noise: the leader's and the baseline's figures on other arrival streams
    spread = []
    _, lead_G, _, lead_p = entries[0]
    for s in range(1, opts.noise_streams + 1):
        for fc, p, ref in ((base_fc, base, bf["throughput_under_slo"]),
                           (fcs[lead_G], lead_p, ranked[0]["throughput_under_slo"])):
            if progress:
                progress(f"noise: arrival stream {s}")
            other = forecast(fc, p, s)[1]["throughput_under_slo"]
            if ref and other:
                spread.append(abs(other - ref) / ref)
    noise = max([search_cfg.tolerance] + spread)
    ranked, choice = choose(ranked, noise)
    parts = []
    if opts.attribute and ranked and ranked[0]["throughput_under_slo"]:
        _, G, v, _ = next(e for e in entries if e[0] is ranked[0])
        parts = attribution(fcs[G], v, ranked[0], bf, forecast, served, progress)
    sens = []
    if opts.sensitivity and ranked and ranked[0]["throughput_under_slo"]:
        _, G, v, _ = next(e for e in entries if e[0] is ranked[0])
        sens = compute_sensitivity(
            fcs[G], v, base_fc, BASELINE, served,
            lambda fc, p: slo.slos(fc.run_rate(p, rates[0], duration, *io)),
            lambda fc, p, s: _forecast(fc, p, rates, s, keys, duration, io, search_cfg)[1],
            opts.sensitivity, progress)
    return clean({"model": base_fc.dims.name, "topology": base_fc.topo.name,
                  "accelerator": base_fc.acc.name, "compute_model": compute_model(base_fc.acc),
                  "sensitivity": sens, "eps": eps, "slos": slos, "slo_keys": list(keys),
                  "rates": rates, "ranked": ranked, "noise": noise, "noise_spread": spread,
                  "choice": choice,
                  "search": {"tolerance": search_cfg.tolerance, "max_steps": search_cfg.max_steps},
                  "budget": {"token_budget": base_fc.budget, "max_running": base_fc.max_running},
                  "attribution": parts,
                  "baseline": {"system": "sglang", "ep": eps[0], **bf,
                               "curve": base_curve, "search_points": base_extra},
                  "screened": [{**_row(v, G), "capacity_estimate": c} for c, G, v in screened],
                  "skipped": skipped, "wall_seconds": time.perf_counter() - t0})


def _forecast(fc, p, rates, slos, keys, duration, io, cfg, stream=0):
    """(grid curve, figures under the SLOs of `keys` together and of each key, searched
    points) of one deployment."""
    curve = [fc.run_rate(p, r, duration, *io, stream=stream) for r in rates]
    targets = {"slo": tuple(keys), **{k: (k,) for k in keys}}
    found, extra = fc.under_slo(p, curve, slos, targets, duration, *io, cfg, stream=stream)
    return curve, {**_found(found["slo"]), "under_each": {k: _found(found[k]) for k in keys}}, extra


def _found(f: dict) -> dict:
    return {"max_rate_under_slo": f["rate"], "throughput_under_slo": f["throughput"],
            "rate_interval": f["rate_interval"], "throughput_interval": f["throughput_interval"],
            "search_steps": f["steps"], "converged": f["converged"]}


def attribution(fc, v: Variant, final: dict, base: dict, forecast, served, progress=None
                ) -> list[dict]:
    """What the gain of deployment `v` (figures `final`) over the baseline (`base`) is made
    of: SGLang's launch changed one part at a time -- the placement (eplb's balance without
    replicas, then eplb with the deployment's replica slots: the redundancy, then a locality
    placement's locality with the same slots), then
    the request policy (Attention DP), then the pipeline -- each step forecast like the
    plan's deployments; `gain` = its throughput under the SLO / the previous step's."""
    G = fc.G
    steps = []
    if v.placement not in ("vanilla", "eplb"):
        # balance apart from locality: eplb (load only) first, then its replica slots (the
        # redundancy, eplb's own use of them), then the placement itself with the same slots
        steps.append(("placement: balance (eplb)", Variant("eplb", "sglang-ep")))
        if v.redundant_slots(G):
            steps.append((f"redundancy ({v.redundant_slots(G)} slots, eplb)",
                          Variant("eplb", "sglang-ep", redundant=v.redundant)))
        steps.append((f"placement: locality ({v.placement})",
                      Variant(v.placement, "sglang-ep", redundant=v.redundant)))
    elif v.placement == "eplb" and v.redundant_slots(G):
        steps.append(("placement: balance (eplb)", Variant("eplb", "sglang-ep")))
        steps.append((f"redundancy ({v.redundant_slots(G)} slots, eplb)",
                      Variant("eplb", "sglang-ep", redundant=v.redundant)))
    elif v.placement != "vanilla" or v.redundant_slots(G):
        steps.append(("placement: balance (eplb)" if v.placement == "eplb" else "placement",
                      Variant(v.placement, "sglang-ep", redundant=v.redundant)))
    pipe = PIPELINES.get(v.pipeline)
    if pipe.attention == "dp" and v.policy != "round-robin":
        steps.append(("request policy", Variant(v.placement, "sglang-ep", v.policy, v.schedule,
                                                v.redundant)))
    if v.pipeline != "sglang-ep":
        steps.append(("pipeline", v))
    out, prev = [], base
    for i, (part, step) in enumerate(steps):
        if i == len(steps) - 1:
            fig = final
        else:
            if progress:
                progress(f"attribution: {part} ({step.label()})")
            fig = forecast(fc, fc.prepare(step, served=served))[1]
        t, t0 = fig["throughput_under_slo"], prev["throughput_under_slo"]
        out.append({"part": part, "deployment": f"{step.label()} r={step.redundant_slots(G)}",
                    "throughput_under_slo": t, "throughput_interval": fig["throughput_interval"],
                    "gain": t / t0 if t and t0 else None})
        prev = fig
    return out


def _row(v: Variant, G: int) -> dict:
    return {"pipeline": v.pipeline, "placement": v.placement, "policy": v.policy,
            "redundant": v.redundant_slots(G), "ep": G}
