"""Benchmark: CAMoE cost-aware routing (issue 6 item 4; CAMoE §3.4, §4.4-4.5, Tables 1-2).

Both tiny models (tiny-moe64: 64 experts top-8, tiny-mixtral: 8 experts top-2), vanilla EP 8,
Attention-DP homes, on hetero-cloud (CAMoE's emulated cloud, 4 nodes x 2 GPUs) and pcie-upi8
(two PCIe sockets joined by UPI). The lambda sweep {0, 0.05, ..., 0.25} runs each model on the
held-out text of every corpus domain (at most --tokens-per-domain tokens each) with the gate
bias hooked into its routers, and reports the simulated all-to-all per MoE layer (CAMoE eq. 9:
mean and p95 over (forward, layer) samples, and per layer), the routing shift (KL against
lambda = 0, global cv, mean per-layer cv: CAMoE Table 2), and perplexity / next-token accuracy
per domain. Then ours at lambda = 0.25 beside CAMoE's -15.8% mean, -19.1% p95, -1.2 accuracy
points (Qwen3-30B-A3B, nine downstream tasks), and the Pareto point (largest mean cut within a
--max-acc-loss accuracy budget). All latencies are simulated from the alpha-beta model, not
measured; the comparison is of ratios. Asserts nothing.

    python benchmarks/bench_cost_routing.py [--corpus /work/cache/corpus] [--tokens-per-domain 2048]
        [--models tiny-moe64 tiny-mixtral] [--topologies hetero-cloud pcie-upi8] [--json] [--plot DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from sempar.costroute.report import CAMOE, COLUMNS, layer_rows, pareto_line, pareto_plot, table_rows
from sempar.costroute.sweep import DEFAULT_LAMBDAS, SweepConfig, run_sweeps


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*r) for r in rows])


def side_by_side(results: list[dict]) -> list[list[str]]:
    rows = [["CAMoE (paper)", CAMOE["model"], "4-GPU cloud", "0.25",
             f"{100 * CAMOE['a2a_mean_change']:+.1f}%", f"{100 * CAMOE['a2a_p95_change']:+.1f}%",
             f"{CAMOE['acc_change_points']:+.2f}", "n/a", f"{CAMOE['kl']:.4f}",
             f"{CAMOE['cv'][0]:.3f}->{CAMOE['cv'][1]:.3f}"]]
    for r in results:
        pts = {p["lambda"]: p for p in r["points"]}
        lam = max(pts)
        p, b = pts[lam], pts[0.0]
        rows.append(["ours", r["model"], r["topology"], f"{lam:g}",
                     f"{100 * p['a2a_mean_change']:+.1f}%", f"{100 * p['a2a_p95_change']:+.1f}%",
                     f"{p['acc_change_points']:+.2f}", f"{100 * p['ppl_change']:+.1f}%",
                     f"{p['kl']:.4f}", f"{b['cv']:.3f}->{p['cv']:.3f}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path(os.environ.get("SEMPAR_CORPUS",
                                                                       "/work/cache/corpus")))
    ap.add_argument("--models", nargs="+", default=["tiny-moe64", "tiny-mixtral"])
    ap.add_argument("--topologies", nargs="+", default=["hetero-cloud", "pcie-upi8"])
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--lambdas", type=float, nargs="+", default=list(DEFAULT_LAMBDAS))
    ap.add_argument("--tokens-per-domain", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--token-bytes", type=int, default=None,
                    help="bytes of one hidden state (default: the model's hidden size in bf16)")
    ap.add_argument("--mode", default="logits", choices=["logits", "select"])
    ap.add_argument("--max-acc-loss", type=float, default=1.2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", type=Path, default=None)
    a = ap.parse_args()

    results, seconds = [], {}
    for model in a.models:
        cfg = SweepConfig(model=model, topologies=tuple(a.topologies), ep=a.ep,
                          lambdas=tuple(a.lambdas), tokens_per_domain=a.tokens_per_domain,
                          seq_len=a.seq_len, corpus=a.corpus, token_bytes=a.token_bytes,
                          mode=a.mode, max_acc_loss=a.max_acc_loss)
        t0 = time.perf_counter()
        results += run_sweeps(cfg, progress=lambda m, model=model: print(
            f"[{model}] {m}", file=sys.stderr, flush=True))
        seconds[model] = time.perf_counter() - t0
    if a.plot is not None:
        pareto_plot(results, a.plot / "cost_routing_pareto.png")
    if a.json:
        print(json.dumps({"camoe": CAMOE, "sweeps": results, "seconds": seconds}, indent=1))
        return
    for r in results:
        print(f"\n== {r['model']} on {r['topology']}: EP {r['ep']} {r['placement']}, "
              f"{r['tokens']} held-out tokens ({len(r['domains'])} domains), {r['forwards']} "
              f"forwards of {r['batch_size']} x {r['seq_len']}, {r['bytes']['dispatch']:.0f} B "
              f"per dispatched activation, mode {r['mode']}")
        print(_table(COLUMNS, table_rows(r)))
        print("per layer, mean/p95 all-to-all change (%):")
        print(_table(["layer"] + [f"l={p['lambda']:g}" for p in r["points"][1:]], layer_rows(r)))
        doms = list(r["points"][0]["quality"])
        print("accuracy % per domain (lambda 0 -> max):  " + ", ".join(
            f"{d} {100 * r['points'][0]['quality'][d]['acc']:.1f}->"
            f"{100 * r['points'][-1]['quality'][d]['acc']:.1f}" for d in doms))
        print(pareto_line(r))
    print("\n== side by side at the largest lambda (CAMoE: Qwen3-30B-A3B, Table 1-2)")
    print(_table(["who", "model", "topology", "lambda", "a2a mean", "a2a p95", "acc pt",
                  "ppl", "KL", "cv"], side_by_side(results)))
    print("\n== Pareto points (rule: " + results[0]["pareto"]["rule"] + ")")
    for r in results:
        print("  " + pareto_line(r))
    print("\nwall time: " + ", ".join(f"{m} {s:.0f} s" for m, s in seconds.items()),
          file=sys.stderr)


if __name__ == "__main__":
    main()
