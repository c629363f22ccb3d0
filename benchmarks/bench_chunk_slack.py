"""Benchmark: the align step's price (issue 26 item 3). In tp mode with exact pre-routing each
(token, layer) is homed on the device hosting most of its experts, but every device takes an
equal share of each batch of 2,048 tokens (Sem-MoE Alg. 3's align step). A chunk slack epsilon
lets a device take up to ceil((1 + epsilon) x 2048 / G) (`placement.capacity.slack_shares`).

Per real trace (full-traces/, split 20/80 by request, seed 0), EP degree and placement method
(solved on the fit split, mode tp, objective rows), for each epsilon on the eval split:
- LAR of the capacity-bound oracle homes (`schedule.homes.oracle_home(slack=epsilon)`), next to
  the unconstrained one (every token on its best device);
- the largest and smallest chunk per (batch, layer) as a share of batch / G (mean over them);
- the simulator's time per MoE layer (ms, mean over batches, nccl model, bf16, on a100x4-ib
  with G / 4 nodes unless --topology names another preset) of the `smoe`
  pipeline (shuffled RS -> A2A dispatch -> A2A combine -> shuffled AG) with those homes: the
  all-to-all phases, the RS + AG (padded to the largest chunk: `comm.simulate.ring_buffer`) and
  their sum. `smoe-exact` adds its router-logit all-reduce on top, the same at every epsilon.

Asserts nothing; all times are simulated from the alpha-beta model. Reading (2 traces, EP 4 / 8,
3 methods, a100x4-ib and pcie-upi8): the slack never pays. LAR rises (sempar GPT-OSS EP 4 0.578
-> 0.603 at 0.2), but the all-to-all phases stay flat (eq. 9 is the slowest pair, and the
largest chunk's device sends more) while the padded RS + AG grow with the largest chunk, so the
net per layer is 1.2-2.1 % slower at 0.02 and 14-19 % at 0.2; hence `--chunk-slack` is on
`sempar evaluate` (the LAR figures) and not on `sempar simulate`.

    PYTHONPATH=src python benchmarks/bench_chunk_slack.py [--traces gpt-oss-20b-mmlu ...]
        [--ep 4 8] [--eps 0 0.02 0.05 0.1 0.2] [--methods sempar moetuner vanilla]
        [--data /work/shared/data/real/full-traces] [--topology a100x4-ib | pcie-upi8] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from sempar.comm.pipelines import PIPELINES
from sempar.comm.simulate import SimOptions, simulate
from sempar.comm.topology_presets import topology_preset
from sempar.placement import solve
from sempar.placement.capacity import BATCH
from sempar.placement.metrics import placement_figures
from sempar.schedule.homes import oracle_home
from sempar.trace.ops import split_by_request

HIDDEN = {"gpt-oss-20b": 2880, "deepseek-v2-lite": 2048}   # config.json hidden_size


def chunk_shares(home: np.ndarray, G: int, batch: int = BATCH) -> tuple[float, float]:
    """(mean largest, mean smallest) chunk per (batch, layer) over batch / G; home int[T, L]."""
    T, L = home.shape
    b = np.arange(T) // batch
    nb = int(b[-1]) + 1
    n = np.bincount(b, minlength=nb).astype(np.float64)
    key = (b[:, None] * G + home).astype(np.int64) + (np.arange(L) * nb * G)[None, :]
    c = np.bincount(key.ravel(), minlength=L * nb * G).reshape(L, nb, G) / (n[None, :, None] / G)
    return float(c.max(axis=2).mean()), float(c.min(axis=2).mean())


def run(traces: list[str], eps: list[float], ep_list: list[int], methods: list[str],
        cache: str, topology: str = "a100x4-ib") -> list[dict]:
    """The real traces (`bench_placement_real.load_real`: imported with `sempar import arrays`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_placement_real import load_real

    rows = []
    pipe = PIPELINES.get("smoe")
    for name, tr in load_real(traces, cache).items():
        fit, ev = split_by_request(tr, seed=0)
        hidden = next(v for k, v in HIDDEN.items() if name.startswith(k))
        opts = SimOptions(hidden=hidden, dtype_bytes=2)
        for G in ep_list:
            topo = (topology_preset(topology, G // 4) if topology == "a100x4-ib"
                    else topology_preset(topology))
            for meth in methods:
                p = solve(meth, fit, num_devices=G, mode="tp", objective="rows")
                free = placement_figures(p, ev.experts, oracle_home(p, ev.experts, None))
                for e in eps:
                    home = oracle_home(p, ev.experts, slack=e)
                    lar = placement_figures(p, ev.experts, home)["lar_mean"]
                    hi, lo = chunk_shares(home, G)
                    res = simulate(ev.experts, home, p, topo, pipe, opts)
                    ph = [L["seconds_by_phase"] for L in res["layers"]]
                    a2a = 1e3 * float(np.mean([L["a2a_seconds"] for L in res["layers"]]))
                    rsag = 1e3 * float(np.mean([x["collectives"] for x in ph]))
                    rows.append({"trace": tr.meta.model, "ep": G, "topology": topo.name,
                                 "method": meth, "eps": e, "lar": lar,
                                 "lar_free": free["lar_mean"], "chunk_max": hi, "chunk_min": lo,
                                 "a2a_ms": a2a, "rsag_ms": rsag, "net_ms": a2a + rsag})
                    print(f"# {tr.meta.model} EP {G} {meth} eps {e}: LAR {lar:.4f}",
                          file=sys.stderr, flush=True)
    base = {(r["trace"], r["ep"], r["method"]): r for r in rows if r["eps"] == 0}
    for r in rows:
        b = base.get((r["trace"], r["ep"], r["method"]))
        r["net_vs_eps0"] = None if b is None else r["net_ms"] / b["net_ms"]
    return rows


def table(rows: list[dict]) -> str:
    head = ["trace", "EP", "topology", "method", "eps", "LAR", "free LAR", "max chunk",
            "min chunk", "a2a ms", "RS+AG ms", "net ms", "net x eps0"]
    body = [[r["trace"], str(r["ep"]), r["topology"], r["method"], f"{r['eps']:g}",
             f"{r['lar']:.4f}", f"{r['lar_free']:.4f}", f"{r['chunk_max']:.3f}",
             f"{r['chunk_min']:.3f}", f"{r['a2a_ms']:.4f}", f"{r['rsag_ms']:.4f}",
             f"{r['net_ms']:.4f}", "-" if r["net_vs_eps0"] is None else f"{r['net_vs_eps0']:.3f}"]
            for r in rows]
    w = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{x}}}" for x in w)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * x for x in w))]
                     + [fmt.format(*b) for b in body])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", nargs="+",
                    default=["gpt-oss-20b-mmlu", "deepseek-v2-lite-esft"])
    ap.add_argument("--ep", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--eps", nargs="+", type=float, default=[0.0, 0.02, 0.05, 0.1, 0.2])
    ap.add_argument("--methods", nargs="+", default=["sempar", "moetuner", "vanilla"])
    ap.add_argument("--cache-dir", default=None,
                    help="folder for the real traces' imports (default: a temporary one)")
    ap.add_argument("--topology", default="a100x4-ib",
                    help="a100x4-ib (G / 4 nodes) or a fixed preset with G devices (pcie-upi8)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.topology == "a100x4-ib" and any(g % 4 for g in a.ep):
        ap.error("--ep: multiples of 4 (a100x4-ib nodes of 4 GPUs)")
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(a.traces, a.eps, a.ep, a.methods, a.cache_dir or tmp, a.topology)
    print(json.dumps({"rows": rows}, indent=1) if a.json else table(rows))


if __name__ == "__main__":
    main()
