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
        [--cache-dir DIR] [--json OUT.json]

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
    """One `sempar` subprocess: wall seconds, its peak RSS in GB (`os.wait4`'s ru_maxrss: the
    process or its largest waited-for descendant, e.g. a `--jobs` worker), return code and the
    last stderr line."""
    import tempfile

    with tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "sempar.cli", *map(str, args)],
                             stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = [ln for ln in err.read().splitlines() if ln.strip()][-1:]
    return {"seconds": round(wall, 1), "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2),
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

    from sempar.affinity.summary_file import load_stats

    x, y = load_stats(a), load_stats(b)
    ok = np.array_equal(x.loads, y.loads) and np.array_equal(x.request_rows, y.request_rows)
    ok &= all((p != q).nnz == 0 for p, q in zip(x.tokens or [], y.tokens or []))
    ok &= all(np.array_equal(x.sample[k], y.sample[k]) for k in x.sample)
    return bool(ok)


def same_placement(a: Path, b: Path) -> bool:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    x.get("info", {}).pop("fit_stats", None)
    return x == y


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
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    paths, whole = synth(a.cache_dir, a.tokens, a.shards, a.whole)
    out = a.cache_dir / "out"
    out.mkdir(exist_ok=True)
    shard_args = [x for p in paths for x in ("--trace", p)]
    res: dict = {"tokens": a.tokens, "shards": a.shards, "ep": a.ep, "jobs": a.jobs}
    for f in out.iterdir():
        f.unlink()
    res["build"] = run("stats", "build", *shard_args, "--jobs", a.jobs, "--out", out / "s.stats")
    res["solve_stats"] = run("place", "--stats", out / "s.stats", "--ep", a.ep,
                             "--out", out / "from-stats.json")
    res["build_plus_solve_s"] = round(res["build"]["seconds"] + res["solve_stats"]["seconds"], 1)
    one = run("stats", "build", "--trace", paths[0], "--out", out / "one.stats")
    res["build_one_shard"] = one          # memory flat in shards: compare peak with `build`
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
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
