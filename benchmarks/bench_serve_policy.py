"""Benchmark: `sempar`'s Attention-DP variant (the `balanced` request policy) against SGLang's
round-robin, with the policy run on the trace's lengths (what serve-sim did before) and on the
lengths the simulation serves (serving/ranks.py, what it does now), per rate.

Prints per rate: tokens/s and median E2E of each, the throughput ratio to `sglang`, and the
requests each DP rank gets; then the throughput under the E2E SLO (5x SGLang's lightest load).

    python benchmarks/bench_serve_policy.py [--trace T] [--preset P] [--topology pcie-upi8]
        [--accelerator cpu] [--ep 8] [--duration 5] [--input-len 256] [--output-len 64]
        [--rates R1,R2,..] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from sempar.paths import assets_dir
from sempar.serving.forecast import clean, default_rates
from sempar.serving.metrics import slos_from
from sempar.serving.setup import forecaster, parse_floats
from sempar.serving.systems import resolve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(assets_dir() / "traces" / "tiny-moe64.parquet"))
    ap.add_argument("--preset", default=None)
    ap.add_argument("--topology", default="pcie-upi8")
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--max-running", type=int, default=128)
    ap.add_argument("--rates", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    fc = forecaster(a.trace, a.preset, a.topology, a.accelerator, a.ep, None, a.token_budget,
                    a.max_running)
    served = ("fixed", a.input_len, a.output_len)
    dp = resolve("sempar").variants[0]
    runs = {"sglang": fc.prepare(resolve("sglang").variants[0], served=served),
            "sempar-dp (trace lengths)": fc.prepare(dp),
            "sempar-dp (served lengths)": fc.prepare(dp, served=served)}
    rates = sorted(parse_floats(a.rates, "--rates") or
                   default_rates(list(runs.values()), a.input_len, a.output_len))
    curves = {k: [fc.run_rate(p, r, a.duration, "fixed", a.input_len, a.output_len) for r in rates]
              for k, p in runs.items()}
    slos = slos_from(curves["sglang"][0], 5.0)
    out = {"trace": a.trace, "topology": fc.topo.name, "accelerator": fc.acc.name, "ep": fc.G,
           "rates": rates, "slos": slos, "systems": {}}
    base = curves["sglang"]
    for k, p in runs.items():
        per_rank = np.bincount(p.request_rank, minlength=fc.G)
        found, _ = fc.under_slo(p, curves[k], slos, {"e2e": ("e2e",)}, a.duration, "fixed",
                                a.input_len, a.output_len)
        out["systems"][k] = {
            "lar": p.table.lar, "requests_per_rank": [int(per_rank.min()), int(per_rank.max())],
            "throughput_under_e2e_slo": found["e2e"]["throughput"],
            "e2e_rate_interval": found["e2e"]["rate_interval"],
            "curve": [{"rate": r, "throughput": m["throughput"], "e2e_p50": m["e2e_p50"],
                       "x_sglang": m["throughput"] / b["throughput"]}
                      for r, m, b in zip(rates, curves[k], base)]}
    if a.json:
        print(json.dumps(clean(out), indent=1))
        return
    print(f"{fc.dims.name} EP {fc.G} on {fc.topo.name}, {fc.acc.name} roofline; "
          f"E2E SLO {slos['e2e'] * 1e3:.1f} ms")
    for k, s in out["systems"].items():
        lo, hi = s["requests_per_rank"]
        thr = s["throughput_under_e2e_slo"]
        print(f"\n{k}: LAR {s['lar']:.3f}, requests per rank {lo}-{hi}, tokens/s under E2E SLO "
              f"{thr or 0:,.0f}")
        for c in s["curve"]:
            print(f"  {c['rate']:>8g} req/s  {c['throughput']:>10,.0f} tok/s  E2E p50 "
                  f"{c['e2e_p50'] * 1e3:>9.1f} ms  x sglang {c['x_sglang']:.3f}")


if __name__ == "__main__":
    main()
