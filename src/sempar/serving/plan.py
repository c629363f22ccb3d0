"""`sempar plan`: rank deployments -- pipeline x placement method x request policy x redundant
slots x EP size -- by forecast throughput under an SLO, and say how to deploy the winner.

Two stages, because a full rate sweep per candidate is the expensive part:

1. screen: every candidate that fits memory is prepared with a coarse step table (SCREEN_TOKENS
   tokens per bucket) and scored by its saturated capacity (forecast.Prepared.capacity);
2. forecast: the `top` best are prepared in full and swept over the same rates; each one's
   throughput under the SLO is the throughput at the largest rate meeting every SLO key given
   (default: TTFT and E2E, Sem-MoE's pair), with the SLOs at 5x the lightest load of SGLang's
   baseline (vanilla placement, round-robin, sglang-ep) on the first EP size unless given.

Candidates come from the registries (placement SOLVERS, comm PIPELINES, REQUEST_POLICIES), so a
solver or pipeline registered later is planned for without a change here. Attention-DP pipelines
take every request policy (round-robin with vanilla homes, the others with the online
schedulers); Attention-TP pipelines re-batch when they can (`pipeline.scheduled`).
"""

from __future__ import annotations

import time

from sempar.comm.pipelines import PIPELINES
from sempar.bounds import check_requests
from sempar.errors import InputError
from sempar.serving.forecast import clean, default_rates
from sempar.serving.metrics import joint_attainment, slos_from
from sempar.serving.systems import Variant

SCREEN_TOKENS = 2048
DEFAULT_METHODS = ("vanilla", "eplb", "moetuner", "exflow", "semmoe", "smoe-cem", "sempar")


DEFAULT_PIPELINES = ("sglang-ep", "exflow", "ds-moe", "smoe", "smoe-exact")


def candidates(methods=None, pipelines=None, policies=None, redundant=(0,)) -> list[Variant]:
    from sempar.placement import SOLVERS
    from sempar.schedule.requests import REQUEST_POLICIES

    methods = [m for m in (methods or DEFAULT_METHODS) if m in SOLVERS]
    pipes = pipelines or [p for p in DEFAULT_PIPELINES if p in PIPELINES]
    for p in pipes:
        PIPELINES.get(p)
    out = []
    for pname in pipes:
        pipe = PIPELINES.get(pname)
        if pipe.attention == "dp":
            pols = [(p, "none" if p == "round-robin" else "online")
                    for p in (policies or REQUEST_POLICIES.names())]
        else:
            pols = [("alg2", "online" if pipe.scheduled else "none")]
        for m in methods:
            for pol, sched in pols:
                for r in redundant:
                    out.append(Variant(m, pname, pol, sched, str(r)))
    return out


def commands(v: Variant, G: int, nodes: int, trace: str, cfg: dict, hidden_layers: int) -> list[str]:
    """How to deploy: sempar's placement and export commands, then the engine's flags."""
    r = v.redundant_slots(G)
    pipe = PIPELINES.get(v.pipeline)
    out = [f"sempar place --trace {trace} --method {v.placement} --ep {G} --nodes {nodes} "
           f"--redundant {r} --out placement.json",
           f"sempar export --placement placement.json --to sglang --out expert-location.json "
           f"--num-hidden-layers {hidden_layers}"]
    flags = [f"--tp-size {G}", f"--ep-size {G}", "--init-expert-location expert-location.json",
             f"--chunked-prefill-size {cfg['token_budget'] // cfg['instances']}",
             f"--max-running-requests {cfg['max_running'] * cfg['instances']}"]
    if pipe.attention == "dp":
        flags[1:1] = ["--enable-dp-attention", f"--dp-size {G}"]
    if v.pipeline == "sglang-ep":
        flags.append("--moe-a2a-backend deepep")
    if r:
        flags.append(f"--ep-num-redundant-experts {r}")
    out.append("python -m sglang.launch_server --model-path MODEL " + " ".join(flags))
    if v.pipeline not in ("sglang-ep", "attn-dp"):
        out.append(f"# pipeline {v.pipeline} is not an upstream SGLang mode: it needs an engine "
                   "that runs it (sempar's runtime measures it with `sempar bench`)")
    if pipe.attention == "dp" and v.policy != "round-robin":
        out.append(f"# request policy {v.policy}: a router in front of the DP ranks sends each "
                   "request to the rank sempar.schedule.requests picks (not an SGLang flag)")
    return out


def plan(make_fc, eps: list[int], trace_path: str, slo_given: dict, slo_keys=("ttft", "e2e"),
         slo_scale: float = 5.0, rates=None, duration: float = 60.0, input_len: int = 512,
         output_len: int = 128, top: int = 4, methods=None, pipelines=None, policies=None,
         redundant=(0,), n_rates: int = 10, progress=None) -> dict:
    """make_fc(ep) -> Forecaster for that EP size. Returns the ranked deployments."""
    t0 = time.perf_counter()
    fcs = {G: make_fc(G) for G in eps}
    served = ("fixed", input_len, output_len)      # DP policies rank by the served lengths
    screened, skipped = [], []
    for G, fc in fcs.items():
        for v in candidates(methods, pipelines, policies, redundant):
            if progress:
                progress(f"screen EP {G}: {v.label()} r={v.redundant}")
            try:
                p = fc.prepare(v, sample_tokens=SCREEN_TOKENS, served=served)
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
    full = []
    for _, G, v in best:
        if progress:
            progress(f"forecast EP {G}: {v.label()}")
        full.append((G, v, fcs[G].prepare(v, served=served)))
    base_fc = fcs[eps[0]]
    base = base_fc.prepare(Variant("vanilla", "sglang-ep"))
    rates = sorted(rates or default_rates([p for _, _, p in full] + [base], input_len, output_len,
                                          n_rates))
    check_requests(rates, duration)         # default rates too: before any rate is simulated
    light = base_fc.run_rate(base, rates[0], duration, "fixed", input_len, output_len)
    slos = slos_from(light, slo_scale, slo_given)
    keys = tuple(slo_given) or slo_keys
    ranked = []
    for G, v, p in full:
        if progress:
            progress(f"sweep EP {G}: {v.label()}")
        curve = [fcs[G].run_rate(p, r, duration, "fixed", input_len, output_len) for r in rates]
        rate, thr = joint_attainment(curve, slos, keys)
        cfg = p.config()
        ranked.append({**_row(v, G), "lar": cfg["lar"], "max_rate_under_slo": rate,
                       "throughput_under_slo": thr, "capacity_estimate": p.capacity(input_len, output_len),
                       "commands": commands(v, G, fcs[G].topo.num_nodes, trace_path, cfg,
                                            fcs[G].dims.layers), "curve": curve})
    ranked.sort(key=lambda r: -(r["throughput_under_slo"] or 0.0))
    base_curve = [base_fc.run_rate(base, r, duration, "fixed", input_len, output_len) for r in rates]
    b_rate, b_thr = joint_attainment(base_curve, slos, keys)
    return clean({"model": base_fc.dims.name, "topology": base_fc.topo.name,
                  "accelerator": base_fc.acc.name, "eps": eps, "slos": slos, "slo_keys": list(keys),
                  "rates": rates, "ranked": ranked,
                  "baseline": {"system": "sglang", "ep": eps[0], "throughput_under_slo": b_thr,
                               "max_rate_under_slo": b_rate},
                  "screened": [{**_row(v, G), "capacity_estimate": c} for c, G, v in screened],
                  "skipped": skipped, "wall_seconds": time.perf_counter() - t0})


def _row(v: Variant, G: int) -> dict:
    return {"pipeline": v.pipeline, "placement": v.placement, "policy": v.policy,
            "redundant": v.redundant_slots(G), "ep": G}
