"""FSE-DP chiplet simulator: the timing target and the reproduction table (ours beside the paper's).

    python benchmarks/bench_stream.py [--iterations 10] [--buffer-mb 8] [--markdown OUT.md] [--json]

1. Timing: qwen3-30b-a3b x 64 tokens/iter x all strategies x 100 iterations (target <= 60 s on the
   shared 2-core CPU), warm (the numba kernel compiled and cached beforehand).
2. Reproduction table: every Table I model x 16/64/256/1024 tokens/iter (the settings of Figs. 9,
   12, 14, 15) on two routings: a synthetic trace of each model's shape and the real routing of
   tiny-moe64 on text it never trained on (src/sempar/assets/traces, mapped onto each shape); plus
   Figs. 16(a), 17 and 18 on the Qwen3 shape at 64 tokens. Every row puts our figure beside the value or range the paper's text gives
   (§VI-B/C/E; the figures themselves carry no numbers in the text) and, where they differ by more
   than 15% (outside a range by more than 15% of its nearest end) or a qualitative claim fails, a
   one-line reason. The package runs at `--buffer-mb` per die (default 8: 32 MiB for 2x2, the
   paper's "< 32 MB" FSE-DP footprint of Fig. 12), int8 weights, the paper's EP (`ep`) and Hydra.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from sempar.atomic import write_text_atomic
from sempar.chiplet.hardware import MB, ChipletConfig
from sempar.chiplet.models import MODELS
from sempar.chiplet.simulate import simulate
from sempar.chiplet.strategies import resolve
from sempar.chiplet.sweeps import buffer_x_ddr, microslice_x_buffer, scaling
from sempar.chiplet.workload import TOKEN_COUNTS, assemble, plain_instances
from sempar.chiplet.workload import load_workload
from sempar.trace import read_trace

MODEL_NAMES = ("phi-3.5-moe", "yuan2.0-m32", "deepseek-moe-16b", "qwen3-30b-a3b")
LARGE = ("phi-3.5-moe", "yuan2.0-m32")          # the large-expert models of Fig. 12
REAL = Path(__file__).resolve().parents[1] / "src/sempar/assets/traces/tiny-moe64.parquet"
A1, A2, A3, A4, A5 = ("fsedp-naive", "fsedp", "fsedp+paired-load", "fsedp+paired-load+rule5",
                      "fsedp+paired-load+buffering20")
PAPER_MB = 32e6 / MB                             # "< 32 MB" (Fig. 12), in MiB
TOL = 0.15
SAVED_PAPER = "~80% on large experts, less on small"


def timing() -> dict:
    m, wl = load_workload("qwen3-30b-a3b", None, 64, 3, 0)
    simulate(wl, ChipletConfig(), resolve("all"))                     # warm-up: numba cache
    t0 = time.perf_counter()
    m, wl = load_workload("qwen3-30b-a3b", None, 64, 100, 0)
    t1 = time.perf_counter()
    r = simulate(wl, ChipletConfig(), resolve("all"))
    t2 = time.perf_counter()
    return {"model": m.name, "tokens_per_iter": 64, "iterations": 100, "strategies": len(r),
            "workload_seconds": t1 - t0, "simulate_seconds": t2 - t1, "total_seconds": t2 - t0,
            "target_seconds": 60.0}


def point(wl, cfg: ChipletConfig) -> dict:
    """Every strategy on one workload: the figures the table needs."""
    r = simulate(wl, cfg, resolve("all"))
    return {n: {"lat": x.layer_latency_s, "e2e": x.e2e_latency_s, "util": x.utilization,
                "peak_mb": x.peak_bytes / MB, "deferrals": x.extra.get("deferrals", 0)} for n, x in r.items()}


def grid(iterations: int, cfg: ChipletConfig) -> list[dict]:
    real = read_trace(REAL) if REAL.exists() else None
    rows = []
    for data in ("synthetic", "tiny-moe64"):
        if data == "tiny-moe64" and real is None:
            continue
        for model in MODEL_NAMES:
            for T in TOKEN_COUNTS:
                if data == "synthetic":
                    _, wl = load_workload(model, None, T, iterations, 0)
                else:
                    wl = assemble(real, MODELS.get(model), T, iterations, source=str(REAL))
                rows.append({"data": data, "model": model, "tokens": T, "buffer_mb": cfg.buffer_bytes / MB,
                             "s": point(wl, cfg)})
                s = rows[-1]["s"]
                print(f"  {data} {model} {T}: A3/EP {s['ep']['lat'] / s[A3]['lat']:.2f}x, "
                      f"mem {s[A3]['peak_mb']:.0f}/{s['ep']['peak_mb']:.0f} MiB", file=sys.stderr, flush=True)
    return rows


def mesh_scaling(wl, cfg: ChipletConfig) -> dict:
    """Fig. 18 (sweeps.scaling) plus, on the largest mesh, A3 with free D2D and the dies a
    micro-slice visits (the diagnosis of a D2D-bound A3)."""
    out = scaling(wl, cfg)
    big = cfg.with_(rows=4, cols=4)
    free = simulate(wl, big.with_(d2d_bw=1e18, xfer_overhead_s=0.0), resolve(A3))[A3]
    counts = plain_instances(wl).counts(big.dies)
    out["free_d2d"] = free.utilization
    out["visits"] = float((counts > 0).sum(axis=2)[counts.sum(axis=2) > 0].mean())
    return out


def dev(x: float, lo: float, hi: float) -> float:
    """Relative distance of x outside [lo, hi] (0 inside)."""
    return x / lo - 1 if x < lo else (x / hi - 1 if x > hi else 0.0)


# ---- reasons: one line each, chosen by the measured condition they explain ----

WHY_SLOW = ("DDR-bound: EP's busiest die carries few more expert loads than the mean at this "
            "skew, and FSE-DP's gain is that balance plus EP's unhidden compute")
WHY_FAST = "EP's unhidden compute is large here (many tokens per expert) and FSE-DP hides it"
WHY_TOKENS = ("one copy of the token inputs and outputs (2 x tokens x d_model x 2 B: 8-16 MiB at 1024 "
              "tokens) comes on top of the filled 4 x {buf:g} MiB micro-slice buffer")
WHY_CAP = ("EP holds 4 x {e:.0f} MiB; FSE-DP fills its {buf:.0f} MiB buffer (Rule 4), capping the "
           "saving at {cap:.0f}% before tokens; the paper's 78.8% is its largest-expert case")
WHY_SMALL_EXPERT = ("small experts ({e:.1f} MiB int8): EP's one expert per die is no more than "
                    "FSE-DP's filled streaming buffer; the paper's saving is for large experts")
WHY_HYDRA = ("Hydra balances token popularity, but at low token counts a die's time is its count of "
             "active experts (a whole load each): its busiest die has more (Qwen3 64 tokens: 1.14x "
             "the mean against EP's 1.10x)")
WHY_HYDRA_UP = ("compute matters at many tokens per expert, and Hydra's placement balances token "
                "popularity over the dies where contiguous EP does not")
WHY_A1_DDR = ("DDR-bound or near it: A1's one-slice look-ahead keeps all four DDR channels as busy as A2's "
              "micro-slice flow; the flow only smooths the per-die load (Fig. 11)")
WHY_A1_COMP = ("compute-bound: A1 redistributes tokens so every die computes n_e / D of them; A2 "
               "keeps tokens home (no redistribution, §IV-C) and inherits their per-die imbalance")
WHY_A3 = ("Rule 4 already prefetches as deep as the buffer allows, so reordering the DDR stream "
          "changes little unless the buffer binds (Yuan2.0 at 4 MiB/die: 1.18x at 16 tokens)")
WHY_A5 = ("deferred requests re-activate their cold experts in a later iteration and few experts "
          "are cold at this token count, so expert loads do not fall (Qwen3, 20% slack: -0.7% at 64 "
          "tokens, +1.4% at 256)")
WHY_A5_30 = ("more slack defers more requests off 1-token experts and saves their whole DDR loads "
             "(Qwen3 16 tokens: expert loads -5% at 20%, -14% at 30%); the paper's loss from a "
             "smaller compute volume does not outweigh that in our DDR-bound layers")
WHY_DSE = ("not diagnosed (likely: Qwen3's 4.5 MiB experts need few slots, so the buffer stops "
           "binding early, and our 16-lane compute model is not the test chip's)")
WHY_SLICES = ("with the smallest buffer 8 micro-slices of a 4.5 MiB expert leave fewer than 8 slots per "
              "die; 16 double them, the buffer-bound corner of Fig. 17")
WHY_MESH = ("A3 is D2D-bound on {mesh}: a micro-slice visits {visits:.1f} dies on average, each hop "
            "paying 0.5 us of transfer overhead (ours); with free D2D it reaches {free:.2f}")


def table(rows: list[dict], fig18: dict) -> list[list[str]]:
    """Rows [figure, routing, model, tokens, quantity, paper, ours, reason]."""
    out: list[list[str]] = []
    for r in rows:
        s, m, T = r["s"], MODELS.get(r["model"]), r["tokens"]
        key = [r["data"], r["model"].split("-")[0], str(T)]
        sp, sh, he = s["ep"]["lat"] / s[A3]["lat"], s["hydra"]["lat"] / s[A3]["lat"], s["ep"]["lat"] / s["hydra"]["lat"]
        for name, x in (("A3 speedup vs EP", sp), ("A3 speedup vs Hydra", sh)):
            d = dev(x, 1.22, 2.00)
            why = (WHY_SLOW if d < 0 else WHY_FAST) if abs(d) > TOL else ""
            out.append(["9", *key, name, "1.22-2.00x", f"{x:.2f}x", why])
        d = dev(he, 1 / (1 + TOL), 1 + TOL)
        out.append(["9", *key, "Hydra vs EP", "no obvious gain (~1x)", f"{he:.2f}x",
                    WHY_HYDRA if d < 0 else (WHY_HYDRA_UP if d > 0 else "")])
        tok = 2 * T * m.d_model * 2 / MB
        peak = s[A3]["peak_mb"]
        w = peak - tok
        why = ""
        if peak > PAPER_MB * (1 + TOL):
            why = (WHY_TOKENS.format(buf=r["buffer_mb"]) if w <= 4 * r["buffer_mb"] + 0.5
                   else "not diagnosed: the weights exceed the buffer")
        out.append(["12", *key, "A3 peak on-chip", "< 32 MB", f"{peak:.1f} MiB", why])
        saved = 1 - peak / s["ep"]["peak_mb"]
        e_mb = m.expert_params / MB
        if r["model"] in LARGE:
            buf = r["buffer_mb"] * 4
            why = "" if saved >= max(0.70, 0.788 / (1 + TOL)) else WHY_CAP.format(e=e_mb, buf=buf, cap=100 * (1 - buf / (4 * e_mb)))
        else:
            why = WHY_SMALL_EXPERT.format(e=e_mb) if saved < 0.5 else ""
        out.append(["12", *key, "memory saved vs EP", SAVED_PAPER, f"{100 * saved:.0f}%", why])
        g = {k: s[a]["e2e"] / s[b]["e2e"] for k, a, b in (("A2/A1", A1, A2), ("A3/A2", A2, A3), ("A4/A3", A3, A4),
                                                           ("A5/A3", A3, A5))}
        why = "" if g["A2/A1"] >= 1.05 else (WHY_A1_COMP if s[A2]["util"] > 0.7 else WHY_A1_DDR)
        out.append(["15", *key, "A2 vs A1 (e2e)", "A2 clearly faster", f"{g['A2/A1']:.2f}x", why])
        out.append(["15", *key, "A3 vs A2 (e2e)", "significant gain", f"{g['A3/A2']:.2f}x",
                    WHY_A3 if g["A3/A2"] < 1.05 else ""])
        out.append(["15", *key, "A4 vs A3 (e2e)", "marginal", f"{g['A4/A3']:.2f}x",
                    "" if abs(g["A4/A3"] - 1) <= TOL else "not diagnosed: Rule 5 only changes which die's buffer takes each micro-slice"])
        out.append(["15", *key, "A5 vs A3 (e2e)", "significant gain", f"{g['A5/A3']:.2f}x",
                    WHY_A5 if g["A5/A3"] < 1.05 else ""])
        b = [s[A3]["e2e"] / s[f"{A3}+buffering{k}"]["e2e"] for k in (10, 20, 30)]
        why = "" if b[2] < max(b[:2]) and max(b[:2]) >= 1.05 else (WHY_A5 if max(b) < 1.05 else WHY_A5_30)
        out.append(["14", *key, "buffering 10/20/30% (e2e)", "moderate helps, 30% can hurt",
                    " / ".join(f"{x:.2f}" for x in b), why])
    u = fig18["utilization"]
    fell = {k: 1 - u[k][-1] / u[k][0] for k in u}
    for i, mesh in enumerate(fig18["meshes"]):
        out.append(["18", "synthetic", "qwen3", "64", f"utilization {mesh} (EP / Hydra / A3)",
                    "EP falls most; A3 falls least", " / ".join(f"{u[k][i]:.2f}" for k in ("ep", "hydra", A3)), ""])
    if not (fell["ep"] >= max(fell.values()) and fell[A3] <= min(fell.values())):
        out[-1][-1] = WHY_MESH.format(mesh=fig18["meshes"][-1], visits=fig18["visits"], free=fig18["free_d2d"])
    out[-1][6] += f" (fell {', '.join(f'{100 * fell[k]:.0f}%' for k in ('ep', 'hydra', A3))})"
    return out + sweep_rows(fig18["fig16a"], fig18["fig17"])


def sweep_rows(g: dict, q: dict) -> list[list[str]]:
    """Figs. 16(a) and 17 on the Qwen3 shape, 64 tokens (the paper's own setting for both)."""
    u, ok = np.array(g["utilization"], float), np.array(g["feasible"])
    need = [(b, d) for i, b in enumerate(g["buffer_mb"]) for j, d in enumerate(g["ddr_gbps_per_die"])
            if u[i, j] > 0.6 and ok[i, j]]
    ddr = min((d for _, d in need), default=None)
    ours = f">= {ddr} GB/s/die, buffer >= {min(b for b, _ in need)} MiB" if need else "none"
    why = "" if ddr is not None and abs(ddr / 48 - 1) <= TOL else WHY_DSE
    rows = [["16", "synthetic", "qwen3", "64", "utilization > 60% within eqs. 1-2 needs",
             ">= 48 GB/s/die and >= 16 MB", ours, why]]
    lat = np.array(q["layer_latency_s"], float)
    best = [q["micro_slices"][int(np.nanargmin(lat[:, j]))] for j in range(lat.shape[1])]
    rows.append(["17", "synthetic", "qwen3", "64", f"best micro-slice count, buffer {'/'.join(map(str, q['buffer_mb']))} MiB",
                 "< 10", ", ".join(map(str, best)), WHY_SLICES if max(best) >= 10 else ""])
    return rows


def markdown(t: list[list[str]], cfg: ChipletConfig, iterations: int) -> str:
    """The table wide: one line per (routing, model, tokens), a column per quantity headed by the
    paper's value; a cell that needs a reason carries [n], and the reasons follow once each."""
    head = (f"`python benchmarks/bench_stream.py --iterations {iterations} --buffer-mb "
            f"{cfg.buffer_bytes / MB:g}`: 2x2, int8, {iterations} iterations per point, `ep` and `hydra` "
            "as the paper runs them; A1-A5 as in §VI-C; e2e: attention + MoE time summed over the run. [n]: ours differs from the paper by more than 15% or the claim fails; why below.\n\n")
    body = [r for r in t if r[0] not in ("16", "17", "18")]
    quants = list(dict.fromkeys(r[4] for r in body))
    paper = {r[4]: r[5] for r in body}
    notes: dict[str, int] = {}
    cells: dict[tuple, dict] = {}
    for r in body:
        c = r[6]
        if r[7]:
            c += f" [{notes.setdefault(r[7], len(notes) + 1)}]"
        cells.setdefault(tuple(r[1:4]), {})[r[4]] = c
    lines = ["| routing | model | tokens | " + " | ".join(f"{q} ({paper[q]})" for q in quants) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in quants) + " |"]
    lines += ["| " + " | ".join(k) + " | " + " | ".join(v.get(q, "") for q in quants) + " |" for k, v in cells.items()]
    other = [r for r in t if r[0] in ("16", "17", "18")]
    if other:
        lines += ["", "| fig | Qwen3 shape, 64 tokens | paper | ours |", "| --- | --- | --- | --- |"]
        for r in other:
            c = r[6] + (f" [{notes.setdefault(r[7], len(notes) + 1)}]" if r[7] else "")
            lines.append(f"| {r[0]} | {r[4]} | {r[5]} | {c} |")
    lines += [""] + [f"[{i}] {why}  " for why, i in notes.items()]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=10, help="iterations per point")
    ap.add_argument("--buffer-mb", type=float, default=8.0, help="on-chip expert buffer per die (MiB)")
    ap.add_argument("--markdown", type=Path, help="write the reproduction table here (Markdown)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip-table", action="store_true")
    a = ap.parse_args()
    t = timing()
    print(f"timing: {t['model']} x {t['tokens_per_iter']} tokens x {t['strategies']} strategies x "
          f"{t['iterations']} iterations: simulate {t['simulate_seconds']:.1f} s + workload "
          f"{t['workload_seconds']:.1f} s = {t['total_seconds']:.1f} s (target 60 s)", file=sys.stderr)
    if a.skip_table:
        return
    cfg = ChipletConfig(buffer_bytes=int(a.buffer_mb * MB))
    rows = grid(a.iterations, cfg)
    _, wl = load_workload("qwen3-30b-a3b", None, 64, 2, 0)
    fig18 = mesh_scaling(wl, cfg)
    fig18["fig16a"] = buffer_x_ddr(wl, cfg)
    fig18["fig17"] = microslice_x_buffer(wl, cfg)
    t_rows = table(rows, fig18)
    md = markdown(t_rows, cfg, a.iterations)
    if a.markdown:
        write_text_atomic(a.markdown, md)
    if a.json:
        print(json.dumps({"timing": t, "points": rows, "fig18": fig18,
                          "table": [dict(zip(("fig", "routing", "model", "tokens", "quantity", "paper", "ours",
                                              "why"), r)) for r in t_rows]}, default=float))
        return
    print(md)
    sp = [r["s"]["ep"]["lat"] / r["s"][A3]["lat"] for r in rows]
    saved = [1 - r["s"][A3]["peak_mb"] / r["s"]["ep"]["peak_mb"] for r in rows if r["model"] in LARGE]
    print(f"A3 vs ep: {min(sp):.2f}-{max(sp):.2f}x (median {np.median(sp):.2f}); memory saved on "
          f"large-expert models: {100 * min(saved):.0f}-{100 * max(saved):.0f}%")


if __name__ == "__main__":
    main()
