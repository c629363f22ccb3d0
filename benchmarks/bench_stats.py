"""Benchmark: routing statistics built shard by shard, and placements solved from them (issue 39).

Target: 20M DeepSeek-V3-shape tokens (58 MoE layers, 256 experts, top-8) in 10 shards, EP 64:
`sempar stats build` + `sempar place --stats` within 10 minutes and 8 GB peak RSS on the 2-core
machine, memory flat in the number of shards; stats merged from the shards equal the stats of
the concatenated trace; placements from stats equal placements from the trace (same seed); the
same build on a local Ray cluster (2 workers) gives identical stats.

Side by side, each step a subprocess of the real CLI (its peak RSS its own, RUSAGE_CHILDREN):
- `build`: `sempar stats build` over the shards (default parts: loads, requests, the request
  sample, token tables), `--jobs`;
- `build-ray`: the same with `--ray local --jobs 2` (skipped without Ray);
- `solve-stats`: `sempar place --stats` at EP 64;
- `solve-trace`: `sempar place --trace` (the concatenated trace, rows objective) at EP 64, the
  whole-trace path, only when `--whole` (it reads the whole trace into memory: T x L x k bytes);
- equality: the merged stats against the whole trace's stats (`--whole`), the two placements.

    python benchmarks/bench_stats.py [--tokens 20000000] [--shards 10] [--ep 64] [--whole]
        [--cache-dir DIR] [--json docs/results/stats.json] [--table docs/results/stats.md]
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
    the largest single process's peak (`ru_maxrss`), the load average before and after, the
    return code and the last stderr line."""
    import tempfile
    import threading

    import psutil

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "sempar.cli", *map(str, args)],
                             stdout=subprocess.DEVNULL, stderr=err)
        peak, done = [0], threading.Event()

        def sample() -> None:
            root = psutil.Process(p.pid)
            while not done.is_set():
                try:
                    procs = [root, *root.children(recursive=True)]
                    peak[0] = max(peak[0], sum(q.memory_info().rss for q in procs
                                               if q.is_running()))
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


def measure(a: argparse.Namespace) -> dict:
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
    res["solve_stats"] = run("place", "--stats", out / "s.stats", "--ep", a.ep,
                             "--out", out / "from-stats.json")
    res["build_plus_solve_s"] = round(res["build"]["seconds"] + res["solve_stats"]["seconds"], 1)
    res["build_plus_solve_cpu_s"] = round(res["build"]["cpu_seconds"]
                                          + res["solve_stats"]["cpu_seconds"], 1)
    # memory flat in shards: one shard's build beside the build of all of them
    res["build_one_shard"] = run("stats", "build", "--trace", paths[0], "--out", out / "one.stats")
    if not a.no_ray:
        try:
            import ray  # noqa: F401
            res["build_ray"] = run("stats", "build", *shard_args, "--ray", "local", "--jobs", 2,
                                   "--out", out / "ray.stats")
            res["ray_equal"] = same_stats(out / "s.stats", out / "ray.stats")
        except ImportError:
            res["build_ray"] = "skipped: ray not installed"
    if a.whole:
        res["build_whole"] = run("stats", "build", "--trace", whole, "--out", out / "w.stats")
        res["merged_equal_whole"] = same_stats(out / "s.stats", out / "w.stats")
        res["solve_trace"] = run("place", "--trace", whole, "--objective", "rows", "--ep", a.ep,
                                 "--out", out / "from-trace.json")
        res["placements_equal"] = same_placement(out / "from-stats.json", out / "from-trace.json")
    return res


STEPS = (("build", "stats build (shards, local)"), ("build_ray", "stats build (shards, Ray local)"),
         ("build_one_shard", "stats build (one shard)"), ("solve_stats", "place --stats"),
         ("build_whole", "stats build (whole trace)"), ("solve_trace", "place --trace (whole)"))


def table(doc: dict) -> str:
    """docs/results/stats.md from the benchmark's JSON (every figure from it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results_stamp import stamp

    lines = ["# Routing statistics: build + solve", "",
             stamp("benchmarks/bench_stats.py --table", "benchmarks/bench_stats.py --json",
                   rows=[("results", "[stats.json](stats.json)")]),
             "Each step is one `sempar` "
             "subprocess; CPU = user + system seconds of it and its waited-for workers; tree RSS "
             "= the peak of the summed RSS of the process and all its descendants (forked "
             "workers' shared pages count twice), process RSS = the largest single process.", ""]
    for r in doc["runs"]:
        lines += [f"## {r['tokens']:,} DeepSeek-V3-shape tokens, {r['shards']} shards, EP {r['ep']}"
                  f" ({r['when']}, {r['cpus']} CPUs, --jobs {r['jobs']})", "",
                  "| step | wall s | CPU s | peak tree RSS GB | peak process RSS GB | load avg "
                  "(before / after) | rc |", "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
        for key, name in STEPS:
            x = r.get(key)
            if isinstance(x, dict):
                lines.append(f"| {name} | {x['seconds']} | {x['cpu_seconds']} | "
                             f"{x['peak_tree_rss_gb']} | {x['peak_process_rss_gb']} | "
                             f"{x['load_before']} / {x['load_after']} | {x['rc']} |")
            elif isinstance(x, str):
                lines.append(f"| {name} | {x} | | | | | |")
        lines += ["", f"- stats build + place --stats: **{r['build_plus_solve_s']} s wall, "
                      f"{r['build_plus_solve_cpu_s']} CPU s** (target: 600 s wall, 8 GB)",
                  f"- stats file: {r['stats_file_gb']} GB; a whole trace's ids alone: "
                  f"{r['whole_trace_ids_gb']} GB in memory"]
        for key, name in (("ray_equal", "Ray-built stats equal the local ones"),
                          ("merged_equal_whole", "merged shard stats equal the whole trace's"),
                          ("placements_equal", "place --stats equals place --trace")):
            if key in r:
                lines.append(f"- {name}: {r[key]}")
        for note in r.get("notes", []):
            lines.append(f"- {note}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--ep", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--whole", action="store_true",
                    help="also the whole-trace stats and solve (reads the trace into memory)")
    ap.add_argument("--no-ray", action="store_true")
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
        res = measure(a)
        res["notes"] = a.note
        print(json.dumps(res, indent=1))
        doc = {"runs": []}
        if a.json and a.json.exists():
            doc = json.loads(a.json.read_text())
        doc["runs"] = [r for r in doc["runs"]
                       if (r["tokens"], r["shards"]) != (a.tokens, a.shards)] + [res]
        doc["runs"].sort(key=lambda r: r["tokens"])
        if a.json:
            a.json.write_text(json.dumps(doc, indent=1) + "\n")
    if a.table:
        a.table.write_text(table(doc) + "\n")


if __name__ == "__main__":
    main()
