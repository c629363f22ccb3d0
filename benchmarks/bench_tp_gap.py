"""Benchmark: the Attention-TP gap, term by term (issue 35, item 4), and Sem-MoE's own TP setting.

(a) The gap. GPT-OSS-20B's shipped MMLU routing (assets/traces/gpt-oss-20b-mmlu.parquet), EP 8
    on `pcie-upi8`, H100 roofline, vanilla placement: SGLang's Attention-DP launch (`sglang-ep`,
    8 instances of 2,048 tokens / 128 requests) against Sem-MoE's Attention-TP with exact
    pre-routing (`smoe-exact`, one instance of 8 x 2,048 tokens / 8 x 128 requests). Per
    deployment and collective model (`nccl`: CAMoE eq. 9, every pair priced as if its route
    were its own; `nccl-links`: plus the links the pairs share), one full iteration (every
    instance at its budget, half its running requests decoding) split into its terms:
    - batch limits: tokens per iteration over all instances, running requests, KV capacity;
    - compute: the dense roofline (attention, router, LM head) and the routed experts;
    - communication: the activation collectives (TP: reduce-scatter + all-gather of every
      token's hidden state per MoE layer), the pre-routing cost (`smoe-exact`'s all-reduce of
      the router logits) and the all-to-all (dispatch + combine of the remote copies);
    - tokens/s at that iteration, and the light-load latency (one request alone: what the SLO
      is 5x of).
(b) Sem-MoE's Attention-TP setting (§4.3, Table 2): DeepSeek-V2-Lite (shipped ESFT routing),
    8 GPUs of 96 GB HBM on a >400 GB/s interconnect (`smoe-a`: the H20 data sheet, serving/
    hardware.py; an NVSwitch of 400 GB/s per GPU port, built here), requests at 1 req/s,
    input 256 / 512 / 1024 tokens (output 64: the paper does not give it; ours). p99 TTFT and
    median E2E of the TP baseline (SGLang's TP attention with EP: `ds-moe`, all-reduce then
    contiguous chunks), Sem-MoE's TP (`smoe-exact` with vanilla and `sempar` placements), and
    SGLang's Attention-DP launch (`sglang-ep`) beside them.

    python benchmarks/bench_tp_gap.py [--json OUT.json] [--duration 20]
    python scripts/make_results.py OUT.json --out docs/results/     # docs/results/tp-gap.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from sempar.comm.pipelines import PIPELINES
from sempar.comm.topology import Topology
from sempar.comm.topology_presets import load_topology
from sempar.paths import real_trace_path
from sempar.serving.dims import model_dims
from sempar.serving.forecast import Forecaster
from sempar.serving.hardware import ACCELERATORS
from sempar.serving.plan import candidates
from sempar.trace import read_trace

GB = 1e9


def variant(method: str, pipeline: str):
    return next(v for v in candidates([method], [pipeline], ["round-robin"]))


def terms(fc: Forecaster, method: str, pipeline: str, input_len=512, output_len=128) -> dict:
    """One full iteration of the deployment, split into its terms (module docstring, (a))."""
    p = fc.prepare(variant(method, pipeline), served=("fixed", input_len, output_len))
    c = p.cfg
    I, B = c.instances, c.budget
    dec = min(c.max_running, B // 2)
    pre = B - dec
    z = np.zeros((1, I))
    ctx = input_len + output_len / 2
    pr, dc = np.full((1, I), float(pre)), z + dec
    kv = pr * input_len / 2 + dc * ctx
    dense = float(p.roofline.dense_seconds(pr, dc, kv, kv, dc)[0])
    comm, expert = p.table.mean(I * B)
    a2a = float(np.mean(p.table.lookup_a2a(np.full(16, I * B), np.arange(16))))
    # the pre-routing cost: smoe-exact's logit all-reduce alone (a pipeline without it: 0)
    pre_cost = 0.0
    if "AR-logits" in PIPELINES.get(pipeline).steps:
        from sempar.comm.collective_models import collective_model
        from sempar.comm.simulate import logit_all_reduce

        cm = collective_model(fc.topo, fc.sim.get("collectives"))
        rs, ag = logit_all_reduce(np.array([float(I * B)]), fc.G, fc.dims.num_experts * 4)
        pre_cost = float(fc.dims.moe_layers * (cm.a2a(fc.topo, "dispatch", rs)[0]
                                               + cm.a2a(fc.topo, "dispatch", ag)[0]))
    light = fc.run_rate(p, 0.05, 40.0, "fixed", input_len, output_len)
    total = dense + comm + expert
    return {"deployment": p.variant.label(), "collectives": fc.sim.get("collectives"),
            "instances": I, "tokens_per_iteration": I * B, "running_max": I * c.max_running,
            "kv_capacity_tokens": I * c.kv_capacity, "lar": p.table.lar,
            "dense_ms": dense * 1e3, "expert_ms": expert * 1e3,
            "activation_collectives_ms": (comm - a2a - pre_cost) * 1e3,
            "prerouting_ms": pre_cost * 1e3, "all_to_all_ms": (a2a) * 1e3,
            "iteration_ms": total * 1e3, "tokens_per_s": I * B / total,
            "light_ttft_p99_ms": light["ttft_p99"] * 1e3, "light_e2e_p50_ms": light["e2e_p50"] * 1e3}


def semmoe_switch() -> Topology:
    """Sem-MoE §4.1's server: 8 GPUs, each one 400 GB/s port into an NVSwitch (cut-through)."""
    port = (429e-9, 1 / (400 * GB))
    links = [x for g in range(8) for x in ((g, "nvswitch", *port), ("nvswitch", g, *port))]
    return Topology.from_links("semmoe-nvswitch8", np.zeros(8, np.int32), links,
                               aggregation="cut-through")


def semmoe_tp(duration: float) -> list[dict]:
    """(b): latency at 1 req/s by input length, Sem-MoE's TP setting."""
    tr = read_trace(real_trace_path("deepseek-v2-lite"))
    fc = Forecaster(tr, model_dims("deepseek-v2-lite"), semmoe_switch(), ACCELERATORS.get("smoe-a"),
                    solve_rows={"sempar": 1500})
    rows = []
    for method, pipeline in (("vanilla", "ds-moe"), ("vanilla", "smoe-exact"),
                             ("sempar", "smoe-exact"), ("vanilla", "sglang-ep")):
        for n_in in (256, 512, 1024):
            p = fc.prepare(variant(method, pipeline), served=("fixed", n_in, 64))
            m = fc.run_rate(p, 1.0, duration, "fixed", n_in, 64)
            rows.append({"deployment": p.variant.label(), "input_len": n_in,
                         "ttft_p99_ms": m["ttft_p99"] * 1e3, "e2e_p50_ms": m["e2e_p50"] * 1e3,
                         "lar": p.table.lar})
    return rows


GAP_TERMS = (("tokens_per_iteration", "batch limit: tokens per iteration (all instances)", "{:,.0f}"),
             ("running_max", "batch limit: running requests", "{:,.0f}"),
             ("kv_capacity_tokens", "KV capacity, tokens (all instances)", "{:,.0f}"),
             ("dense_ms", "dense compute (attention, router, LM head), ms", "{:.1f}"),
             ("expert_ms", "routed experts, ms", "{:.1f}"),
             ("activation_collectives_ms", "activation collectives (TP RS + AG), ms", "{:.1f}"),
             ("prerouting_ms", "pre-routing (logit all-reduce), ms", "{:.1f}"),
             ("all_to_all_ms", "all-to-all (dispatch + combine), ms", "{:.1f}"),
             ("iteration_ms", "one full iteration, ms", "{:.1f}"),
             ("tokens_per_s", "tokens/s at that iteration", "{:,.0f}"),
             ("light_ttft_p99_ms", "light load: p99 TTFT, ms", "{:.1f}"),
             ("light_e2e_p50_ms", "light load: median E2E, ms", "{:.0f}"))


def tables(rows: list[dict]) -> str:
    """Markdown of the benchmark's rows (`--json`): the gap's terms, one column per deployment
    and collective model, and Sem-MoE's TP setting (scripts/make_results.py calls this)."""
    gap = [r for r in rows if r["table"] == "tp-gap"]
    out = []
    if gap:
        out.append("| term (GPT-OSS-20B, pcie-upi8, EP 8, H100, vanilla) | "
                   + " | ".join(f"`{r['deployment'].split('/')[1]}`, {r['collectives']}"
                                for r in gap) + " |")
        out.append("| --- |" + " --- |" * len(gap))
        for key, label, fmt in GAP_TERMS:
            out.append(f"| {label} | " + " | ".join(fmt.format(r[key]) for r in gap) + " |")
        out.append("")
    tp = [r for r in rows if r["table"] == "semmoe-tp"]
    if tp:
        lens = sorted({r["input_len"] for r in tp})
        out.append("| Sem-MoE's TP setting: p99 TTFT / median E2E, ms | "
                   + " | ".join(f"input {n}" for n in lens) + " |")
        out.append("| --- |" + " --- |" * len(lens))
        for dep in dict.fromkeys(r["deployment"] for r in tp):
            cells = {r["input_len"]: r for r in tp if r["deployment"] == dep}
            out.append(f"| `{dep}` (LAR {cells[lens[0]]['lar']:.2f}) | " + " | ".join(
                f"{cells[n]['ttft_p99_ms']:.2f} / {cells[n]['e2e_p50_ms']:.1f}" for n in lens) + " |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--duration", type=float, default=20.0)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    tr = read_trace(real_trace_path("gpt-oss-20b"))
    gap = []
    for coll in ("nccl", "nccl-links"):
        fc = Forecaster(tr, model_dims("gpt-oss-20b"), load_topology("pcie-upi8"),
                        ACCELERATORS.get("h100"), sim={"collectives": coll})
        for pipe in ("sglang-ep", "smoe-exact"):
            r = terms(fc, "vanilla", pipe)
            gap.append(r)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                              for k, v in r.items()}), flush=True)
    tp = semmoe_tp(a.duration)
    for r in tp:
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}),
              flush=True)
    out = ([{"table": "tp-gap", **r} for r in gap] + [{"table": "semmoe-tp", **r} for r in tp])
    print(f"wall {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(tables(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)       # one line: scripts/make_results.py reads the first
    return 0


if __name__ == "__main__":
    sys.exit(main())
