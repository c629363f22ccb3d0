"""Benchmark: `sempar capture` of 10,000 requests of 512 tokens with DeepSeek-V2-Lite's shape
(27 hidden layers, layer 0 dense, MoE layers 1..26 x 64 experts, top-6) from a loopback server
that replays precomputed payloads (tests/engine_fixture_server.py in its own process), so the
figure is the client's: HTTP, JSON, base64, decoding, checks and the trace written to disk.

Target (issue 28): <= 60 s on the 2-core development machine. Each request is a 449-token prompt
and 64 output tokens: 512 rows of routing (prompt + output - 1), 512 x 27 x 6 int32 = 324 KiB
raw, 432 KiB of base64 per SGLang response (vLLM's uint8 .npy: a quarter of it). The whole CLI
runs in a child process (imports and the trace's validation included).

    python benchmarks/bench_capture.py [--requests 10000] [--engine sglang] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"model_type": "deepseek_v2", "num_hidden_layers": 27, "first_k_dense_replace": 1,
          "moe_layer_freq": 1, "n_routed_experts": 64, "n_shared_experts": 2,
          "num_experts_per_tok": 6, "n_group": 1, "topk_group": 1, "vocab_size": 102400}
PROMPT, OUTPUT = 449, 64


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc), NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--engine", default="sglang", choices=["sglang", "vllm"])
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    layer_ids = ",".join(str(i) for i in range(1, 27))
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/engine_fixture_server.py"), "--replay", args.engine,
         "--prompt-len", str(PROMPT), "--output-len", str(OUTPUT), "--hidden-layers", "27",
         "--layer-ids", layer_ids, "--top-k", "6", "--experts", "64"],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        url = server.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            (tmp / "model").mkdir()
            (tmp / "model/config.json").write_text(json.dumps(CONFIG))
            with open(tmp / "prompts.jsonl", "w") as f:
                for i in range(args.requests):
                    f.write(json.dumps({"input_ids": [(i + j) % 100000 for j in range(PROMPT)]})
                            + "\n")
            out = tmp / "trace.parquet"
            t0 = time.perf_counter()
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            res = subprocess.run(
                [sys.executable, "-m", "sempar.cli", "capture", "--url", url, "--engine",
                 args.engine, "--prompts", str(tmp / "prompts.jsonl"), "--out", str(out),
                 "--model-dir", str(tmp / "model"), "--max-new-tokens", str(OUTPUT),
                 "--concurrency", str(args.concurrency), "--json"],
                env=env, capture_output=True, text=True)
            secs = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)     # the capture child only
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            if res.returncode:
                sys.exit(f"capture failed: {res.stderr.strip()[-400:]}")
            summary = json.loads(res.stdout)
            size = out.stat().st_size
        server_cpu = _cpu_seconds(server.pid)
    finally:
        server.terminate()
        server.wait(10)
    rows = summary["tokens"]
    print(f"capture {args.engine} {summary['requests']:,} requests x {rows // summary['requests']} "
          f"routed tokens ({rows:,} rows, 26 MoE layers x top-6 of 27): {secs:.1f} s wall, "
          f"{cpu:.1f} s CPU of the client ({server_cpu:.1f} s of the replay server), "
          f"{summary['requests'] / secs:,.0f} requests/s, {rows / secs / 1e6:.2f} M rows/s "
          f"(target <= 60 s for 10,000 requests: {secs / 60 * 10_000 / summary['requests']:.2f}x "
          f"of budget); trace {size / 2**20:,.0f} MiB; concurrency {args.concurrency}; "
          f"cores {os.cpu_count()}; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
