"""Benchmark: `sempar synth` of 2M tokens with DeepSeek-V3's shape (58 layers, 256 experts, top-8).

Target (issue 2): <= 60 s and <= 4 GB RAM on the 2-core development machine, streaming to disk.
Runs the real command in a child process and reads its peak RSS from the kernel
(resource.getrusage(RUSAGE_CHILDREN)), so the figure covers the whole CLI, imports included.

    python benchmarks/bench_synth.py [--tokens 2000000] [--preset deepseek-v3] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2_000_000)
    ap.add_argument("--preset", default="deepseek-v3")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.parquet"
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "sempar.cli", "synth", "--preset", args.preset,
                            "--tokens", str(args.tokens), "--seed", "1", "--out", str(out)],
                           check=True, stderr=subprocess.DEVNULL)
            times.append(time.perf_counter() - t0)
        size = out.stat().st_size
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    times.sort()
    print(f"synth {args.preset} {args.tokens:,} tokens: min {times[0]:.1f} s, median "
          f"{times[len(times) // 2]:.1f} s over {len(times)} run(s) (target <= 60 s: "
          f"{times[0] / 60:.2f}x of budget)")
    print(f"peak RSS {peak_mb:,.0f} MB (target <= 4096 MB: {peak_mb / 4096:.2f}x of budget); "
          f"file {size / 2**20:,.0f} MiB; cores {os.cpu_count()}")


if __name__ == "__main__":
    main()
