"""Benchmark: sempar's engine-balancer policy against each engine's own default policy (issue 43).

Target: the plug-in's time per rebalance at DeepSeek-V3 shape (58 MoE layers x 256 experts,
EP 32, R = 32 redundant slots) <= 1 s on one core. Side by side in one run, each policy called
as its engine calls it, on the same load windows:

- `sempar`: `sempar.eplb.policy.rebalance_report` (the plug-ins' core), FILE = a stats file
  (`sempar stats build --parts sample,coactivation`) of the fit requests, the old map = the
  map the policy returned at the previous window (steady state); `sempar-first`: the first
  call on a FILE version, which also reads FILE and computes its locality layout
  (`SEMPAR_EPLB_LAYOUT`, default `sempar`: sempar's rows-objective solver on FILE's sample;
  its own cost reported apart, it is paid once per FILE version);
- `vllm-default`: vLLM 0.33.0 `DefaultEplbPolicy.rebalance_experts` (with the old map);
- `sglang-default`: SGLang 0.5.23 `eplb_algorithms.deepseek.rebalance_experts` (hierarchical
  when the model's expert groups allow, as `compute_algorithm("auto")` picks);
- `sempar-port`: sempar's own port of DeepSeek EPLB (`placement/eplb.py`).

Per policy: seconds per rebalance (median wall and thread CPU time over the windows), slots
moved against the previous map, mean per-layer imbalance (max / mean device load of the
window, an expert's load split evenly over its copies), locality (share of the fit's
co-activation kept on one device) and LAR on the window's own tokens (held out: the share of
activations on the device hosting most of each token's k experts).

Shapes: `dsv3` = `sempar synth --preset deepseek-v3` (no public DeepSeek-V3 routing trace is
shipped), EP 32, R 32; `v2lite` / `gptoss` = the shipped real traces (DeepSeek-V2-Lite ESFT
prefill, GPT-OSS-20B MMLU decode), EP 8, R 8. Fit = the first 20% of requests, windows = the
rest in `--windows` equal slices (requests in trace order). Run it on one core:

    taskset -c 0 python benchmarks/bench_eplb_plugin.py [--shapes dsv3,v2lite,gptoss]
        [--tokens 200000] [--windows 4] [--json docs/results/eplb-plugin.json]
    python scripts/make_results.py docs/results/eplb-plugin.json --out docs/results/

Engines not installed: their rows are left out (said in the JSON). Reports; asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "src" / "sempar" / "assets" / "traces"
SHAPES = {"dsv3": ("synth", 32, 32), "v2lite": ("deepseek-v2-lite-esft.parquet", 8, 8),
          "gptoss": ("gpt-oss-20b-mmlu.parquet", 8, 8)}


def _trace(shape: str, tokens: int, cache: Path):
    from sempar.trace import read_trace

    src, _, _ = SHAPES[shape]
    if src != "synth":
        return read_trace(ASSETS / src)
    path = cache / f"dsv3-{tokens}.parquet"
    if not path.exists():
        subprocess.run([sys.executable, "-m", "sempar.cli", "synth", "--preset", "deepseek-v3",
                        "--tokens", str(tokens), "--seed", "1", "--out", str(path)], check=True)
    return read_trace(path)


def _stats_file(fit, path: Path) -> None:
    from sempar.stats.build import StatsBuilder
    from sempar.stats.file import save_stats

    b = StatsBuilder(fit.meta, fit.domains, ("sample", "coactivation"), 0, 200_000, "fit")
    step = 1 << 16
    for lo in range(0, fit.num_tokens, step):
        sl = slice(lo, lo + step)
        b.add({"token_id": fit.token_id[sl], "request_id": fit.request_id[sl],
               "position": fit.position[sl], "experts": fit.experts[sl],
               "domain": None if fit.domain is None else fit.domain[sl]})
    save_stats(b.finish(), path)


def _engine_module(dist: str, rel: str, name: str):
    """An engine's policy module loaded from its installed file (no package __init__), or
    None when the engine is not installed."""
    spec = importlib.util.find_spec(dist)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.exists():
        return None
    if dist == "vllm":
        import vllm.distributed.eplb.policy.default as mod     # imports on CPU
        return mod
    s = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def _figures(m: np.ndarray, w: np.ndarray, A: np.ndarray, ex: np.ndarray, G: int) -> dict:
    from sempar.eplb.policy import _hosts, _imbalance, _locality, map_loads
    from sempar.eplb.report import _lar

    L, N = w.shape
    hosts = [_hosts(m[l], G, N) for l in range(L)]
    imb = [_imbalance(map_loads(m[l], w[l], G)) for l in range(L)]
    return {"imbalance": float(np.mean(imb)), "imbalance_max": float(np.max(imb)),
            "locality": float(np.mean([_locality(h, A[l], float(A[l].sum()))
                                       for l, h in enumerate(hosts)])),
            "lar": _lar(ex, m, G, N)}


def run_shape(shape: str, tokens: int, windows: int, cache: Path) -> dict:
    import torch

    from sempar.eplb.config import PluginConfig
    from sempar.eplb.policy import rebalance_report
    from sempar.eplb.source import _CACHE, load_source
    from sempar.placement.eplb import rebalance_experts as port

    torch.set_num_threads(1)
    tr = _trace(shape, tokens, cache)
    _, G, R = SHAPES[shape]
    L, N = tr.meta.num_layers, tr.meta.num_experts
    P = N + R
    groups = tr.meta.num_expert_groups if N % max(tr.meta.num_expert_groups, 1) == 0 else 1
    reqs = np.unique(tr.request_id, return_index=True)[1]
    order = np.sort(reqs)
    cut = tr.request_id[order[int(0.2 * order.size)]]
    first_row = int(np.flatnonzero(tr.request_id == cut)[0])
    fit = tr.take(np.arange(tr.num_tokens) < first_row)
    stats = cache / f"{shape}-{tokens}.stats"
    if not stats.exists():
        _stats_file(fit, stats)
    rest = np.arange(first_row, tr.num_tokens)
    slices = np.array_split(rest, windows)
    vllm = _engine_module("vllm", "distributed/eplb/policy/default.py", "vllm_default")
    sgl = _engine_module("sglang", "srt/eplb/eplb_algorithms/deepseek.py", "sglang_deepseek")
    cfg = PluginConfig.from_env()
    _CACHE.clear()
    t0, c0 = time.perf_counter(), time.thread_time()
    src = load_source(str(stats), num_layers=L, num_experts=N, num_ranks=G)
    t1, c1 = time.perf_counter(), time.thread_time()
    src.home(G, cfg.seed, cfg.layout)
    used, _, why = src.layouts.get((G, cfg.layout), ("placement", 0.0, None))
    first = {"seconds": time.perf_counter() - t0, "cpu_seconds": time.thread_time() - c0,
             "layout": used, "layout_fallback": why,
             "layout_seconds": time.perf_counter() - t1,
             "layout_cpu_seconds": time.thread_time() - c1}
    A = src.affinity
    rows: dict[str, list] = {}
    prev: dict[str, np.ndarray | None] = {}

    def call(name, fn):
        t, c = time.perf_counter(), time.thread_time()
        m = fn()
        rows.setdefault(name, []).append({"seconds": time.perf_counter() - t,
                                          "cpu_seconds": time.thread_time() - c})
        return np.asarray(m, np.int64)

    for i, sl in enumerate(slices):
        ex = tr.experts[sl]
        w = np.stack([np.bincount(ex[:, l].ravel(), minlength=N) for l in range(L)]
                     ).astype(np.float64)
        sample = ex[np.linspace(0, ex.shape[0] - 1, min(4096, ex.shape[0])).astype(int)]
        maps = {}
        rep = {}
        maps["sempar"] = call("sempar", lambda: (lambda r: (rep.update(r=r[1]), r[0])[1])(
            rebalance_report(w, P, groups, 1, G, prev.get("sempar"), src, cfg)))
        if vllm is not None:
            old = prev.get("vllm-default")
            maps["vllm-default"] = call("vllm-default", lambda: vllm.DefaultEplbPolicy.rebalance_experts(
                torch.tensor(w), P, groups, 1, G,
                None if old is None else torch.tensor(old)).numpy())
        if sgl is not None:
            maps["sglang-default"] = call("sglang-default", lambda: sgl.rebalance_experts(
                torch.tensor(w), P, groups, 1, G, enable_hierarchical=groups > 1)[0].numpy())
        maps["sempar-port"] = call("sempar-port", lambda: port(w, P, groups, 1, G)[0])
        for name, m in maps.items():
            r = rows[name][-1]
            r.update(_figures(m, w, A, sample, G))
            old = prev.get(name)
            r["moves"] = None if old is None else int((m != old).sum())
            prev[name] = m
        rows["sempar"][-1]["report"] = rep["r"].line()
    out = {"shape": shape, "layers": L, "experts": N, "ep": G, "redundant": R,
           "tokens": int(tr.num_tokens), "windows": windows, "groups": groups,
           "sempar_first_call": first, "policies": {}}
    for name, rs in rows.items():
        later = [r for r in rs if r["moves"] is not None]
        out["policies"][name] = {
            "seconds_median": float(np.median([r["seconds"] for r in rs])),
            "cpu_seconds_median": float(np.median([r["cpu_seconds"] for r in rs])),
            "cpu_seconds_max": float(np.max([r["cpu_seconds"] for r in rs])),
            "moves_mean": float(np.mean([r["moves"] for r in later])) if later else None,
            "imbalance": float(np.mean([r["imbalance"] for r in rs])),
            "locality": float(np.mean([r["locality"] for r in rs])),
            "lar": float(np.mean([r["lar"] for r in rs])),
            "windows": rs}
    if vllm is None:
        out["left_out"] = ["vllm-default: vLLM not installed"]
    if sgl is None:
        out.setdefault("left_out", []).append("sglang-default: SGLang not installed")
    return out


def _layout_note(first: dict) -> str:
    """The first call's layout, its own cost and any fallback (older JSON: none recorded)."""
    if "layout" not in first:
        return ""
    why = f", sempar fell back: {first['layout_fallback']}" if first["layout_fallback"] else ""
    return (f"; of it the `{first['layout']}` layout {first['layout_cpu_seconds']:.2f} s CPU, "
            f"{first['layout_seconds']:.2f} s wall{why}")


def tables(rows: list[dict]) -> str:
    """Markdown: one table per shape, the policies side by side (scripts/make_results.py)."""
    out = []
    for r in rows:
        first = r["sempar_first_call"]
        out += [f"**{r['shape']}**: {r['layers']} MoE layers x {r['experts']} experts, EP "
                f"{r['ep']}, R {r['redundant']}; {r['windows']} load windows: the last 80% of the "
                f"trace's {r['tokens']} tokens (fit: the first 20%); load average {r['load_average'][0]:.1f} "
                f"(cores {r['cpu_affinity']}). sempar's first call on a FILE version (read + "
                f"locality layout): {first['cpu_seconds']:.2f} s CPU, {first['seconds']:.2f} s "
                f"wall{_layout_note(first)}.",
                "",
                "| policy | s CPU / rebalance (median) | max | s wall (median) | slots moved "
                "(mean) | imbalance | locality | LAR (held out) |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, p in r["policies"].items():
            mv = "-" if p["moves_mean"] is None else f"{p['moves_mean']:.0f}"
            out.append(f"| {name} | {p['cpu_seconds_median']:.3f} | {p['cpu_seconds_max']:.3f} "
                       f"| {p['seconds_median']:.3f} | {mv} | {p['imbalance']:.3f} | "
                       f"{p['locality']:.3f} | {p['lar']:.3f} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="dsv3,v2lite,gptoss")
    ap.add_argument("--tokens", type=int, default=200_000, help="synthetic DeepSeek-V3 tokens")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cache = Path(a.cache_dir or tempfile.mkdtemp(prefix="bench-eplb-"))
    cache.mkdir(parents=True, exist_ok=True)
    res = []
    for shape in a.shapes.split(","):
        load = os.getloadavg()
        r = run_shape(shape, a.tokens, a.windows, cache)
        r.update(benchmark="eplb-plugin", cpu_affinity=sorted(os.sched_getaffinity(0)),
                 load_average=list(load), load_average_after=list(os.getloadavg()))
        res.append(r)
        print(tables([r]))
    text = json.dumps(res)          # one line: scripts/make_results.py reads it
    if a.json:
        from sempar.atomic import write_text_atomic

        write_text_atomic(a.json, text + "\n", "--json")


if __name__ == "__main__":
    main()
