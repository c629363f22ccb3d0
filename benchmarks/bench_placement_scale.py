"""Benchmark: do the co-clustering solvers scale to real model shapes (issue 4)?

Targets (issues 4 and 15): on a synthetic DeepSeek-V3-shaped trace (58 layers, 256 experts,
top-8, vocabulary 129,280, 2M fit tokens) at EP 64 as 8 nodes x 8 devices, `semmoe`,
`smoe-cem` and `sempar` (tp mode, its default; these traces take its large-trace path,
placement/sempar/scale.py) finish in <= 120 s and <= 8 GB; on a Qwen3-30B-A3B-shaped trace
(48 layers, 128 experts, 1M tokens) at EP 8, in <= 30 s. `vanilla` and `eplb` are timed for
reference (no target).

Read targets (issue 19): reading the 2M-token DeepSeek-V3 trace in <= 10 s and <= 1.5 GB (the
trace in format 2, what `sempar synth` writes; a cached format 1 file is read too and its rows
say so). Two
rows measure it: `read` (read_trace into memory, the columns `place` reads: what every solver
starts with; its floor is the expert-id array itself, T x L x k int16 = 1.86 GB for that trace)
and `read-stream` (trace_info: every row validated, statistics summed row group by row group,
as a verb that needs no per-token arrays reads).

Each (trace, method) runs in its own subprocess so that its peak RSS is its own. Reported:
`read_s` (read_trace), `solve_s` (sempar.placement.solve, validation included, wall),
`solve_cpu_s` (CPU of the solve, the solver's forked layer workers included; the process's own
in `solve_cpu_main_s`), `rss_after_read_gb`, and the memory peaks: `main_peak_rss_gb` (the
process's ru_maxrss: the trace read's peak counts too), `workers_peak_rss_gb` (the largest
layer worker's ru_maxrss, RUSAGE_CHILDREN), `solve_peak_rss_gb` (the
highest sum of the process's and its workers' RSS, sampled every 20 ms while solving; the
pages they share, the trace above all, counted once per process: an upper bound) and
`tree_peak_pss_gb` (the same sum of PSS, shared pages split between the sharers, sampled every
1 s). The time target is judged on `solve_s` (the read is the same for every method and is
reported beside it); the memory target on `peak_rss_gb`, the higher of `main_peak_rss_gb` and
`solve_peak_rss_gb`. A worker whose RSS passes --rss-cap-gb is stopped (the
machine is shared) and reported as such.

    python benchmarks/bench_placement_scale.py [--trace dsv3=PATH] [--trace qwen3=PATH]
        [--cases dsv3 qwen3] [--methods semmoe,smoe-cem,sempar,vanilla,eplb] [--json]

Traces are synthesised (seed 1, `sempar synth`'s generator) into --cache-dir unless given
with --trace or already there. This script reports what it measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self

CASES = {
    # name: (preset, tokens, EP degree, nodes, {method: solve-seconds target}, RSS target GB)
    "dsv3": ("deepseek-v3", 2_000_000, 64, 8,
             {"semmoe": 120.0, "smoe-cem": 120.0, "sempar": 120.0}, 8.0),
    "qwen3": ("qwen3-30b-a3b", 1_000_000, 8, 1,
              {"semmoe": 30.0, "smoe-cem": 30.0, "sempar": 30.0}, None),
}
DEFAULT_METHODS = "read,read-stream,semmoe,smoe-cem,sempar,vanilla,eplb"
# Pseudo-methods that only read the trace: (read seconds, peak RSS GB) targets of issue 19.
READS = {"read": (10.0, 1.5), "read-stream": (10.0, 1.5)}
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes(pid: str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _children() -> list[str]:
    """This process's child processes (the solver's layer workers), from /proc."""
    out = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                out += f.read().split()
    except OSError:
        pass
    return out


def _pss_bytes(pid: str) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """Highest RSS seen every `period` seconds; exits the process past `cap` bytes.

    `peak`: this process's RSS; `tree_peak`: the sum of the RSS of this process and its
    children (the solver's forked layer workers), pages they share (the trace) counted once per
    process: an upper bound; `tree_pss_peak`: the sum of their PSS (shared pages split among
    the processes sharing them: the memory in use), sampled every `pss_every` samples (reading
    smaps_rollup walks the page tables). The cap applies to the RSS sum."""

    def __init__(self, cap: float, period: float = 0.02, pss_every: int = 50):
        self.cap, self.period, self.pss_every = cap, period, pss_every
        self.peak = self.tree_peak = self.tree_pss_peak = 0
        self._kids: list[str] = []
        self.most_children = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _sample(self, i: int) -> int:
        rss = _rss_bytes()
        self.peak = max(self.peak, rss)
        if i % 5 == 0:                            # the workers live as long as the solve
            self._kids = _children()
            self.most_children = max(self.most_children, len(self._kids))
        tree, pss = rss, 0
        for pid in self._kids:
            try:
                tree += _rss_bytes(pid)
                if i % self.pss_every == 0:
                    pss += _pss_bytes(pid)
            except OSError:                       # a worker that just ended
                pass
        if i % self.pss_every == 0:
            try:
                pss += _pss_bytes("self")
            except OSError:
                pss += rss
            self.tree_pss_peak = max(self.tree_pss_peak, pss)
        self.tree_peak = max(self.tree_peak, tree)
        return tree

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            tree = self._sample(i)
            i += 1
            if tree > self.cap:
                print(json.dumps({"error": f"RSS {tree / 1e9:.1f} GB passed the cap "
                                           f"{self.cap / 1e9:.1f} GB; stopped"}), flush=True)
                os._exit(3)
            time.sleep(self.period)

    def __enter__(self) -> Self:
        self._sample(0)
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self._sample(0)


def read_worker(path: str, method: str, cap_gb: float) -> None:
    """Only read the trace (READS); print one JSON line."""
    from sempar.trace import read_header, read_trace, trace_info

    version = read_header(path)[1]["format_version"]
    with RssSampler(cap_gb * 1e9):
        t0, c0 = time.perf_counter(), time.process_time()
        if method == "read":
            tokens = read_trace(path, optional=("domain",)).num_tokens
        else:
            tokens = trace_info(path)["tokens"]
        read_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"read_s": read_s, "read_cpu_s": cpu_s, "tokens": tokens,
                      "format_version": version,
                      "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                      * 1024 / 1e9}), flush=True)


def worker(path: str, method: str, ep: int, nodes: int, cap_gb: float) -> None:
    """Read, solve, check; print one JSON line."""
    import numpy as np

    if method in READS:
        read_worker(path, method, cap_gb)
        return

    from sempar.placement import solve
    from sempar.trace import read_trace

    cap = cap_gb * 1e9
    with RssSampler(cap):
        t0 = time.perf_counter()
        trace = read_trace(path)
        read_s = time.perf_counter() - t0
    after_read = _rss_bytes()
    with RssSampler(cap) as rs:
        t0, c0 = time.perf_counter(), time.process_time()
        pl = solve(method, trace, num_devices=ep, num_nodes=nodes)
        solve_s, solve_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    L, N = trace.meta.num_layers, trace.meta.num_experts
    balanced = pl.slots_per_device == N // ep and all(
        np.array_equal(np.sort(pl.phy2log[l]), np.arange(N)) for l in range(L))
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    out = {"read_s": read_s, "solve_s": solve_s,
           "solve_cpu_s": solve_cpu_s + kids.ru_utime + kids.ru_stime,
           "solve_cpu_main_s": solve_cpu_s,
           # the memory target: this process's peak or, with layer workers, the highest sampled
           # sum of the process's and its workers' RSS (shared pages counted in each), if higher
           "peak_rss_gb": max(own, rs.tree_peak / 1e9), "main_peak_rss_gb": own,
           "workers_peak_rss_gb": kids.ru_maxrss * 1024 / 1e9,
           "layer_workers": rs.most_children,          # child processes seen while solving
           "tree_peak_pss_gb": rs.tree_pss_peak / 1e9,
           "rss_after_read_gb": after_read / 1e9, "solve_peak_rss_gb": rs.tree_peak / 1e9,
           "tokens": trace.num_tokens, "layers": L, "experts": N,
           "experts_per_device_ok": bool(balanced)}
    tt = pl.token_table
    if tt is not None:
        out["token_table"] = {"layers": tt.num_layers, "tokens": tt.num_tokens,
                              "distinct_fit_tokens": int(np.unique(trace.token_id).size),
                              "devices_in_range": bool(((tt.device >= 0) & (tt.device < ep)).all())}
    cem = pl.info.get("cem")
    if cem:
        out["cem"] = {k: cem[k] for k in ("hierarchy", "clustered_tokens", "token_coverage")}
    if "large_trace_path" in pl.info:
        out["large_trace_path"] = pl.info["large_trace_path"]
    if method == "sempar":                # the settings it solved with (solving by name)
        from dataclasses import asdict

        from sempar.placement.sempar import SemparConfig

        out["sempar_config"] = asdict(SemparConfig.for_shape(trace.num_tokens, L, N, ep))
    if "request_features" in pl.info:
        out["request_features"] = pl.info["request_features"]
    print(json.dumps(out), flush=True)


def ensure_trace(case: str, given: dict[str, str], cache: Path, log) -> tuple[str, float | None]:
    """(path, seconds spent synthesising or None when reused)."""
    if case in given:
        return given[case], None
    preset, tokens = CASES[case][:2]
    path = cache / f"{case}-{tokens // 1000}k.parquet"
    if path.exists():
        return str(path), None
    from sempar.trace.synth import SynthGenerator

    log(f"synthesising {preset} with {tokens} tokens into {path} ...")
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    SynthGenerator(preset, tokens, None, 1).write(path)
    return str(path), time.perf_counter() - t0


def run_case(case: str, path: str, methods: list[str], cap_gb: float, timeout: float,
             log) -> dict:
    _, _, ep, nodes, targets, rss_target = CASES[case]
    res = {}
    for m in methods:
        log(f"{case}: {m} at EP {ep} ({nodes} nodes) ...")
        cmd = [sys.executable, __file__, "--worker", path, m, str(ep), str(nodes), str(cap_gb)]
        t0 = time.perf_counter()
        try:
            cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
            lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("{")]
            r = json.loads(lines[-1]) if lines else {"error": (cp.stderr.strip().splitlines()
                                                               or [f"exit {cp.returncode}"])[-1]}
        except subprocess.TimeoutExpired:
            r = {"error": f"timed out after {timeout:.0f} s"}
        r["wall_s"] = time.perf_counter() - t0
        if m in READS and case == "dsv3":
            t, gb = READS[m]
            r["targets"] = {"read_s": t, "read_pass": bool(r.get("read_s", t + 1) <= t),
                            "peak_rss_gb": gb,
                            "rss_pass": bool(r.get("peak_rss_gb", gb + 1) <= gb)}
        elif m in targets:
            t = targets[m]
            ok_t = "solve_s" in r and r["solve_s"] <= t
            r["targets"] = {"solve_s": t, "solve_pass": bool(ok_t)}
            if rss_target is not None:
                r["targets"]["peak_rss_gb"] = rss_target
                r["targets"]["rss_pass"] = bool("peak_rss_gb" in r
                                                and r["peak_rss_gb"] <= rss_target)
        res[m] = r
    return {"preset": CASES[case][0], "trace": path, "ep": ep, "nodes": nodes, "methods": res}


def print_table(report: dict) -> None:
    for case, c in report["cases"].items():
        print(f"\n{case}: {c['preset']}, {c['trace']}, EP {c['ep']} x {c['nodes']} node(s)")
        print(f"{'method':<11} {'read s':>7} {'solve s':>8} {'cpu s':>7} {'peak GB':>8} "
              f"{'solve GB':>8} {'pss GB':>7} {'target':>16}  notes")
        for m, r in c["methods"].items():
            if "error" in r:
                print(f"{m:<11} {'':>7} {'':>8} {'':>7} {'':>8} {'':>8} {'':>7} {'':>16}  "
                      f"{r['error']}")
                continue
            tg = r.get("targets")
            verdict = ""
            if m in READS:
                if tg:
                    verdict = (f"<={tg['read_s']:.0f}s {'PASS' if tg['read_pass'] else 'MISS'} "
                               f"{'PASS' if tg['rss_pass'] else 'MISS'}")
                print(f"{m:<11} {r['read_s']:7.1f} {'':>8} {r['read_cpu_s']:7.1f} "
                      f"{r['peak_rss_gb']:8.2f} {'':>8} {'':>7} {verdict:>16}  read only, trace "
                      f"format {r.get('format_version')}")
                continue
            if tg:
                verdict = f"<={tg['solve_s']:.0f}s {'PASS' if tg['solve_pass'] else 'MISS'}"
                if "rss_pass" in tg:
                    verdict += f" {'PASS' if tg['rss_pass'] else 'MISS'}"
            notes = []
            if not r.get("experts_per_device_ok", True):
                notes.append("UNBALANCED experts")
            if "cem" in r:
                notes.append(f"{r['cem']['hierarchy']}, {r['cem']['clustered_tokens']} tokens "
                             f"clustered ({r['cem']['token_coverage']:.0%} of occurrences)")
            if r.get("large_trace_path"):
                notes.append("large-trace path")
            if r.get("layer_workers", 1) > 1:
                notes.append(f"{r['layer_workers']} layer workers (largest "
                             f"{r['workers_peak_rss_gb']:.2f} GB)")
            if "request_features" in r:
                notes.append(f"requests: {r['request_features']}")
            print(f"{m:<11} {r['read_s']:7.1f} {r['solve_s']:8.1f} {r['solve_cpu_s']:7.1f} "
                  f"{r['peak_rss_gb']:8.2f} "
                  f"{r['solve_peak_rss_gb']:8.2f} {r.get('tree_peak_pss_gb', 0):7.2f} "
                  f"{verdict:>16}  {'; '.join(notes)}")
    m = report["machine"]
    print(f"\ntime target on solve s (wall; cpu s = CPU time of the solve, all threads and "
          f"layer workers; read rows: read s and the read's CPU time); memory target on peak GB "
          f"(the process's peak, trace read included, or the sum of the process's and its "
          f"layer workers' RSS if higher: shared pages counted in each); solve GB = that RSS "
          f"sum, the highest sampled while solving; pss GB = the same with shared pages split. "
          f"{m['cpus']} CPUs, load average {m['load_avg_1m_at_start']:.1f} at start, "
          f"{m['load_avg_1m_at_end']:.1f} at end (a shared machine: wall times stretch with "
          f"the load)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, path, method, ep, nodes, cap = sys.argv
        worker(path, method, int(ep), int(nodes), float(cap))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", default=[], metavar="CASE=PATH",
                    help="reuse a trace for a case (dsv3, qwen3)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--cache-dir", default=os.environ.get("SEMPAR_SCALE_CACHE",
                                                          "/work/cache/scale"))
    ap.add_argument("--rss-cap-gb", type=float, default=14.0,
                    help="stop a worker whose RSS passes this (the machine is shared)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per worker")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args()
    given = dict(t.split("=", 1) for t in args.trace)
    bad = set(given) - set(CASES)
    if bad:
        ap.error(f"--trace: unknown case {min(bad)!r} (cases: {', '.join(CASES)})")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    report = {"cases": {}, "machine": {"cpus": os.cpu_count(),
                                       "load_avg_1m_at_start": os.getloadavg()[0]}}
    for case in args.cases:
        path, synth_s = ensure_trace(case, given, Path(args.cache_dir), log)
        report["cases"][case] = run_case(case, path, args.methods.split(","), args.rss_cap_gb,
                                         args.timeout, log)
        if synth_s is not None:
            report["cases"][case]["synth_s"] = synth_s
    report["machine"]["load_avg_1m_at_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)


if __name__ == "__main__":
    main()
