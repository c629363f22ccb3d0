"""Benchmark: routing statistics built shard by shard, and placements solved from them (#39, #46).

Target (issue 46): 20M DeepSeek-V3-shape tokens (58 MoE layers, 256 experts, top-8) in 10 shards,
EP 64: `sempar stats build` + `sempar place --stats` within 10 minutes wall and 8 GB peak RSS
across processes on the 2-core machine (the pipeline's peak: the larger of the two steps' peak
tree RSS, each summed over the step's process and all its descendants), memory flat in the
number of shards (the token tables are capped, `stats.sketch`); stats merged from the shards
equal the stats of the concatenated trace; placements from stats equal placements from the
trace (same seed); the same build on a local Ray cluster (2 workers) gives identical stats.

Side by side, each step a subprocess of the real CLI (its peak RSS its own, RUSAGE_CHILDREN):
- `build`: `sempar stats build` over the shards (default parts: loads, requests, the request
  sample, token tables), `--jobs`;
- `build-ray`: the same with `--ray local --jobs 2` (skipped without Ray);
- `solve-stats`: `sempar place --stats` at EP 64;
- `solve-trace`: `sempar place --trace` (the concatenated trace, rows objective) at EP 64, the
  whole-trace path, only when `--whole` (it reads the whole trace into memory: T x L x k bytes);
- equality: the merged stats against the whole trace's stats (`--whole`), the two placements;
- `--side-by-side`: 240k DeepSeek-V3-shape tokens (issue 46's "placed in about a minute"
  target: <= 60 s wall and <= 4 GB), `place --trace` and `place --stats` at EP 16 and EP 64
  with default flags, each its wall, CPU and peak tree RSS (the stats built once beforehand).

The results file is rewritten after every step, so a run stopped early keeps what it measured.

    python benchmarks/bench_stats.py [--tokens 20000000] [--shards 10] [--ep 64] [--whole]
        [--no-ray] [--no-one-shard] [--side-by-side] [--cache-dir DIR]
        [--json docs/results/stats.json] [--table docs/results/stats.md]
    python scripts/make_results.py docs/results/stats.json --out docs/results/
    python benchmarks/bench_stats.py --from docs/results/stats.json --table docs/results/stats.md

Shards are synthesised (`sempar synth --shards`, seed 1) into --cache-dir unless there. This
script reports what it measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def run(*args: str) -> dict:
    """One `sempar` subprocess: wall seconds, CPU seconds (user + system, its waited-for
    descendants included: `os.wait4`), peak RSS of the whole process tree (`psutil`, sampled
    every 0.2 s: forked `--jobs` workers and a local Ray cluster's processes count together),
    the largest single process's peak (`ru_maxrss`), the sampled peaks of the step's own
    process and of its largest descendant (a build worker, a layer solve), the load average
    before and after, the return code and the last stderr line."""
    import tempfile
    import threading

    import psutil

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "sempar.cli", *map(str, args)],
                             stdout=subprocess.DEVNULL, stderr=err)
        peak, done = [0, 0, 0], threading.Event()     # tree, own process, largest child

        def rss(q) -> int:
            try:
                return q.memory_info().rss if q.is_running() else 0
            except psutil.Error:
                return 0

        def sample() -> None:
            root = psutil.Process(p.pid)
            while not done.is_set():
                try:
                    kids = [rss(q) for q in root.children(recursive=True)]
                    own = rss(root)
                    peak[0] = max(peak[0], own + sum(kids))
                    peak[1] = max(peak[1], own)
                    peak[2] = max(peak[2], *kids, 0)
                except psutil.Error:
                    pass
                done.wait(0.2)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        _, status, usage = os.wait4(p.pid, 0)
        done.set()
        th.join()
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = [ln for ln in err.read().splitlines() if ln.strip()][-1:]
    return {"seconds": round(wall, 1), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_tree_rss_gb": round(peak[0] / 2**30, 2),
            "peak_process_rss_gb": round(usage.ru_maxrss / 2**20, 2),
            "peak_main_rss_gb": round(peak[1] / 2**30, 2),
            "peak_child_rss_gb": round(peak[2] / 2**30, 2),
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
            "rc": p.returncode, "stderr": tail}


def synth(cache: Path, tokens: int, shards: int, whole: bool) -> tuple[list[Path], Path]:
    base = cache / f"dsv3-{tokens}.parquet"
    width = len(str(shards - 1))
    paths = [base.with_name(f"{base.stem}.{i:0{width}d}.parquet") for i in range(shards)]
    if not all(p.exists() for p in paths):
        r = run("synth", "--preset", "deepseek-v3", "--tokens", tokens, "--seed", 1,
                "--shards", shards, "--out", base)
        print(f"synth {tokens} tokens in {shards} shards: {r}", file=sys.stderr)
    if whole and not base.exists():
        r = run("synth", "--preset", "deepseek-v3", "--tokens", tokens, "--seed", 1, "--out", base)
        print(f"synth whole: {r}", file=sys.stderr)
    return paths, base


def same_stats(a: Path, b: Path) -> bool:
    import numpy as np

    from sempar.stats.file import load_stats

    x, y = load_stats(a), load_stats(b)
    ok = np.array_equal(x.loads, y.loads) and np.array_equal(x.request_rows, y.request_rows)
    ok &= all((p != q).nnz == 0 for p, q in zip(x.tokens or [], y.tokens or []))
    ok &= all(np.array_equal(x.sample[k], y.sample[k]) for k in x.sample)
    return bool(ok)


def same_placement(a: Path, b: Path) -> bool:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    x.get("info", {}).pop("fit_stats", None)
    return x == y


def whole_trace_gb(tokens: int, L: int = 58, k: int = 8) -> float:
    """GB a whole trace's ids take in memory before any solve: uint8 experts int[T, L, k] plus
    token, request and position ids (int32 each): the floor of the whole-trace path."""
    return round(tokens * (L * k + 12) / 2**30, 2)


def stats_info(path: Path) -> dict:
    """`sempar stats info --json` of a stats file (the token tables' cells, cap and error)."""
    r = subprocess.run([sys.executable, "-m", "sempar.cli", "stats", "info", str(path), "--json"],
                       capture_output=True, text=True)
    if r.returncode:
        return {"error": r.stderr.strip()[-200:]}
    info = json.loads(r.stdout)
    return {k: info[k] for k in ("rows", "token_cells", "token_table_cells", "token_error_max")
            if k in info}


def measure(a: argparse.Namespace, save) -> dict:
    """The pipeline's steps (module docstring); `save(res)` after each."""
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    paths, whole = synth(a.cache_dir, a.tokens, a.shards, a.whole)
    out = a.cache_dir / "out"
    out.mkdir(exist_ok=True)
    shard_args = [x for p in paths for x in ("--trace", p)]
    res: dict = {"tokens": a.tokens, "shards": a.shards, "ep": a.ep, "jobs": a.jobs,
                 "cpus": os.cpu_count(), "whole_trace_ids_gb": whole_trace_gb(a.tokens),
                 "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for f in out.iterdir():
        f.unlink()
    res["build"] = run("stats", "build", *shard_args, "--jobs", a.jobs, "--out", out / "s.stats")
    res["stats_file_gb"] = round((out / "s.stats").stat().st_size / 2**30, 2)
    res["stats_info"] = stats_info(out / "s.stats")
    save(res)
    res["solve_stats"] = run("place", "--stats", out / "s.stats", "--ep", a.ep,
                             "--out", out / "from-stats.json")
    res["build_plus_solve_s"] = round(res["build"]["seconds"] + res["solve_stats"]["seconds"], 1)
    res["build_plus_solve_cpu_s"] = round(res["build"]["cpu_seconds"]
                                          + res["solve_stats"]["cpu_seconds"], 1)
    res["pipeline_peak_rss_gb"] = max(res["build"]["peak_tree_rss_gb"],
                                      res["solve_stats"]["peak_tree_rss_gb"])
    save(res)
    if not a.no_one_shard:       # memory flat in shards: one shard's build beside all of them
        res["build_one_shard"] = run("stats", "build", "--trace", paths[0],
                                     "--out", out / "one.stats")
        save(res)
    if not a.no_ray:
        try:
            import ray  # noqa: F401
            res["build_ray"] = run("stats", "build", *shard_args, "--ray", "local", "--jobs", 2,
                                   "--out", out / "ray.stats")
            res["ray_equal"] = same_stats(out / "s.stats", out / "ray.stats")
        except ImportError:
            res["build_ray"] = "skipped: ray not installed"
        save(res)
    if a.whole:
        res["build_whole"] = run("stats", "build", "--trace", whole, "--out", out / "w.stats")
        res["merged_equal_whole"] = same_stats(out / "s.stats", out / "w.stats")
        res["solve_trace"] = run("place", "--trace", whole, "--objective", "rows", "--ep", a.ep,
                                 "--out", out / "from-trace.json")
        res["placements_equal"] = same_placement(out / "from-stats.json", out / "from-trace.json")
        save(res)
    return res


SIDE_TOKENS = 240_000
SIDE_EPS = (16, 64)


def side_by_side(a: argparse.Namespace, save) -> dict:
    """240k DeepSeek-V3-shape tokens: `place --trace` and `place --stats` (default flags) at
    EP 16 and 64, each step its own subprocess (module docstring)."""
    cache = a.cache_dir / "side"
    cache.mkdir(parents=True, exist_ok=True)
    trace = cache / f"dsv3-{SIDE_TOKENS}.parquet"
    if not trace.exists():
        run("synth", "--preset", "deepseek-v3", "--tokens", SIDE_TOKENS, "--seed", 1,
            "--out", trace)
    res: dict = {"tokens": SIDE_TOKENS, "cpus": os.cpu_count(),
                 "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "build": run("stats", "build", "--trace", trace, "--out", cache / "s.stats")}
    for ep in SIDE_EPS:
        save(side=res)
        res[f"stats_ep{ep}"] = run("place", "--stats", cache / "s.stats", "--ep", ep,
                                   "--out", cache / f"stats-{ep}.json")
        save(side=res)
        res[f"trace_ep{ep}"] = run("place", "--trace", trace, "--ep", ep,
                                   "--out", cache / f"trace-{ep}.json")
        res[f"same_ep{ep}"] = same_placement(cache / f"stats-{ep}.json",
                                             cache / f"trace-{ep}.json")
    return res


STEPS = (("build", "stats build (shards, local)"), ("build_ray", "stats build (shards, Ray local)"),
         ("build_one_shard", "stats build (one shard)"), ("solve_stats", "place --stats"),
         ("build_whole", "stats build (whole trace)"), ("solve_trace", "place --trace (whole)"))


def _row(name: str, x) -> str:
    if isinstance(x, dict):
        split = (f"{x['peak_main_rss_gb']} / {x['peak_child_rss_gb']}"
                 if "peak_main_rss_gb" in x else "")
        return (f"| {name} | {x['seconds']} | {x['cpu_seconds']} | {x['peak_tree_rss_gb']} | "
                f"{x['peak_process_rss_gb']} | {split} | {x['load_before']} / "
                f"{x['load_after']} | {x['rc']} |")
    return f"| {name} | {x} | | | | | | |"


HEAD = ["| step | wall s | CPU s | peak tree RSS GB | peak process RSS GB | main / largest "
        "worker GB | load avg (before / after) | rc |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]


def body(doc: dict) -> str:
    """The page's tables and notes from the benchmark's JSON (every figure from it)."""
    lines = ["Each step is one `sempar` subprocess; CPU = user + system seconds of it and its "
             "waited-for workers; tree RSS = the peak of the summed RSS of the process and all "
             "its descendants (sampled every 0.2 s; forked workers' shared pages count twice): "
             "the peak across processes; process RSS = the largest single process; main / "
             "largest worker = the sampled peaks of the step's own process and of its largest "
             "descendant (blank in runs before they were recorded).", ""]
    for r in doc["runs"]:
        lines += [f"## {r['tokens']:,} DeepSeek-V3-shape tokens, {r['shards']} shards, EP {r['ep']}"
                  f" ({r['when']}, {r['cpus']} CPUs, --jobs {r['jobs']})", "", *HEAD]
        lines += [_row(name, r[key]) for key, name in STEPS if key in r]
        lines.append("")
        if "build_plus_solve_s" in r:
            peak = r.get("pipeline_peak_rss_gb", "")
            lines.append(f"- stats build + place --stats: **{r['build_plus_solve_s']} s wall, "
                         f"{r['build_plus_solve_cpu_s']} CPU s"
                         + (f", peak {peak} GB across processes" if peak != "" else "")
                         + "** (target: 600 s wall, 8 GB)")
        lines.append(f"- stats file: {r['stats_file_gb']} GB; a whole trace's ids alone: "
                     f"{r['whole_trace_ids_gb']} GB in memory")
        info = r.get("stats_info") or {}
        if "token_table_cells" in info:
            lines.append(f"- token tables: {info['token_table_cells']:,} cells, cap "
                         f"{info['token_cells']:,} a layer (`stats.sketch`), counts read low by "
                         f"at most {info['token_error_max']} (0: exact)")
        for key, name in (("ray_equal", "Ray-built stats equal the local ones"),
                          ("merged_equal_whole", "merged shard stats equal the whole trace's"),
                          ("placements_equal", "place --stats equals place --trace")):
            if key in r:
                lines.append(f"- {name}: {r[key]}")
        for note in r.get("notes", []):
            lines.append(f"- {note}")
        lines.append("")
    side = doc.get("side_by_side")
    if side:
        lines += [f"## {side['tokens']:,} DeepSeek-V3-shape tokens: place from the trace and from "
                  f"stats, default flags ({side['when']}, {side['cpus']} CPUs)", "",
                  "Target (issue 46): <= 60 s wall and <= 4 GB on 2 cores.", "", *HEAD,
                  _row("stats build (one file)", side["build"])]
        for ep in SIDE_EPS:
            if f"trace_ep{ep}" in side:
                lines.append(_row(f"place --trace, EP {ep}", side[f"trace_ep{ep}"]))
            if f"stats_ep{ep}" in side:
                lines.append(_row(f"place --stats, EP {ep}", side[f"stats_ep{ep}"]))
        lines.append("")
        for ep in SIDE_EPS:
            if f"same_ep{ep}" in side:
                lines.append(f"- EP {ep}: place --stats equals place --trace: "
                             f"{side[f'same_ep{ep}']}")
        for note in side.get("notes", []):
            lines.append(f"- {note}")
        lines.append("")
    return "\n".join(lines)


def table(doc: dict) -> str:
    """docs/results/stats.md from the benchmark's JSON (`scripts/make_results.py` makes the
    same page with its own stamp)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results_stamp import stamp

    return "\n".join(["# Routing statistics: build + solve", "",
                      stamp("benchmarks/bench_stats.py --table", "benchmarks/bench_stats.py --json",
                            rows=[("results", "[stats.json](stats.json)")]), body(doc)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--ep", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--whole", action="store_true",
                    help="also the whole-trace stats and solve (reads the trace into memory)")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-one-shard", action="store_true", help="skip the one-shard build")
    ap.add_argument("--no-pipeline", action="store_true", help="only --side-by-side")
    ap.add_argument("--side-by-side", action="store_true",
                    help="also 240k tokens: place --trace / --stats at EP 16 and 64")
    ap.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) /
                    "sempar-bench-stats")
    ap.add_argument("--json", type=Path, help="results file: this run replaces the run of the "
                                              "same tokens and shards in it")
    ap.add_argument("--note", action="append", default=[], help="a line kept with the run")
    ap.add_argument("--from", dest="from_json", type=Path,
                    help="measure nothing: render --table from this JSON")
    ap.add_argument("--table", type=Path, help="write the markdown table (docs/results/stats.md)")
    a = ap.parse_args()
    if a.from_json:
        doc = json.loads(a.from_json.read_text())
    else:
        doc = {"runs": []}
        if a.json and a.json.exists():
            doc = json.loads(a.json.read_text())

        def save(res: dict | None = None, side: dict | None = None) -> None:
            if res is not None:
                res["notes"] = a.note
                doc["runs"] = [r for r in doc["runs"]
                               if (r["tokens"], r["shards"]) != (res["tokens"], res["shards"])]
                doc["runs"] = sorted(doc["runs"] + [res], key=lambda r: r["tokens"])
            if side is not None:
                side["notes"] = a.note
                doc["side_by_side"] = side
            if a.json:
                a.json.write_text(json.dumps(doc, indent=1) + "\n")

        if not a.no_pipeline:
            res = measure(a, save)
            print(json.dumps(res, indent=1))
        if a.side_by_side:
            side = side_by_side(a, save)
            save(side=side)
            print(json.dumps(side, indent=1))
    if a.table:
        a.table.write_text(table(doc) + "\n")


if __name__ == "__main__":
    main()
