"""Benchmark: `sempar place` with default flags at DeepSeek-V3 shape, source trees side by side
(issue 46 item 4: "placed in about a minute").

Target (issue 46): 240k DeepSeek-V3-shape tokens (`sempar synth --preset deepseek-v3 --tokens
240000 --seed 1`: 58 MoE layers x 256 experts, top-8), `place --trace` and `place --stats`
(stats built once beforehand) at EP 16 and EP 64 with default flags: <= 60 s wall on 2 cores
and <= 4 GB. On a shared machine wall time says little, so every run also reports its CPU
seconds (user + system, forked layer workers included) and the load average around it, and
`--src LABEL=DIR` runs the same steps with another source tree (e.g. the commit before a
change, `git archive <commit> src | tar -x -C DIR`) right beside this one, so the CPU ratio
is measured under the same load.

Per (source tree, EP, input): wall, CPU, peak RSS (bench_stats.run: each step a subprocess of
the real CLI), the held-out calibration the placement records (`held_out`: predicted point and
upper imbalance, cross-validation inflation, within budget), and whether its phy2log equals
the first tree's. `--quality`: per (tree, EP) `sempar evaluate --split` (fit on 20 % of the
requests, scored on the other 80 %; default flags, `--methods sempar`): held-out exact-home LAR
and imbalance beside the predicted ones.

    python benchmarks/bench_placement_v3.py [--src base=/tmp/base/src] [--eps 16 64]
        [--inputs trace stats] [--quality] [--cache-dir DIR] [--json out.json]

This script reports what it measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stats import run  # noqa: E402  (one CLI subprocess: wall, CPU, RSS, load)

HERE = Path(__file__).resolve().parents[1] / "src"


def _env(src: Path) -> None:
    """Make the next subprocess import sempar from `src` (bench_stats.run inherits os.environ)."""
    os.environ["PYTHONPATH"] = str(src)


def _phy2log(path: Path):
    return json.loads(path.read_text()).get("phy2log")


def _held_out(path: Path) -> dict:
    info = json.loads(path.read_text()).get("info", {})
    h = info.get("held_out") or {}
    keep = ("predicted_imbalance", "predicted_upper", "bootstrap_imbalance", "fit_cap",
            "cv_inflation", "cv_inflation_upper", "within_budget", "fit_requests")
    return {k: h.get(k) for k in keep} | {"fit_rows": info.get("fit_rows")}


def quality(trace: Path, ep: int) -> dict:
    """`sempar evaluate --split --methods sempar --json` at EP `ep`: sempar's held-out exact-home
    LAR and imbalance, its prediction, and the subprocess's CPU seconds."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "sempar.cli", "evaluate", "--fit", str(trace),
                          "--split", "--ep", str(ep), "--methods", "sempar", "--json"],
                         capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)
    if out.returncode:
        return {"rc": out.returncode, "stderr": out.stderr.strip().splitlines()[-1:]}
    row = json.loads(out.stdout)["methods"]["sempar"]
    h = row.get("held_out") or {}
    return {"lar": row["oracle_lar_mean"], "imbalance": row["imbalance_max_mean"],
            "predicted_imbalance": h.get("predicted_imbalance"),
            "predicted_upper": h.get("predicted_upper"), "within_budget": h.get("within_budget"),
            "cpu_seconds": cpu}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", action="append", default=[],
                    help="LABEL=DIR: another source tree run beside this one (repeatable)")
    ap.add_argument("--tokens", type=int, default=240_000)
    ap.add_argument("--eps", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--inputs", nargs="+", default=["trace", "stats"],
                    choices=["trace", "stats"])
    ap.add_argument("--quality", action="store_true",
                    help="also evaluate --split per (tree, EP): held-out LAR and imbalance")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/sempar-bench-v3"))
    ap.add_argument("--json", type=Path, default=None, help="write the results here too")
    a = ap.parse_args(argv)
    trees = [("this", HERE)] + [(s.split("=", 1)[0], Path(s.split("=", 1)[1]).resolve())
                                for s in a.src]
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    trace = a.cache_dir / f"dsv3-{a.tokens}.parquet"
    stats = a.cache_dir / f"dsv3-{a.tokens}.stats"
    _env(HERE)
    if not trace.exists():
        run("synth", "--preset", "deepseek-v3", "--tokens", a.tokens, "--seed", 1,
            "--out", trace)
    if "stats" in a.inputs and not stats.exists():
        run("stats", "build", "--trace", trace, "--out", stats)
    res: dict = {"tokens": a.tokens, "cpus": os.cpu_count(), "trees": dict(
        (k, str(v)) for k, v in trees), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": []}

    def save() -> None:
        if a.json:
            a.json.write_text(json.dumps(res, indent=1) + "\n")

    for ep in a.eps:
        for source in a.inputs:
            first = None
            for label, src in trees:           # the trees back to back: the same load
                _env(src)
                out = a.cache_dir / f"{label}-{source}-{ep}.json"
                flag = ["--trace", trace] if source == "trace" else ["--stats", stats]
                r = run("place", *flag, "--ep", ep, "--out", out)
                row = {"tree": label, "ep": ep, "input": source, **r}
                if r["rc"] == 0:
                    row["held_out"] = _held_out(out)
                    first = first or _phy2log(out)
                    row["phy2log_equal_first"] = _phy2log(out) == first
                res["runs"].append(row)
                print(json.dumps(row), flush=True)
                save()
        if a.quality:
            for label, src in trees:
                _env(src)
                q = {"tree": label, "ep": ep, **quality(trace, ep)}
                res.setdefault("quality", []).append(q)
                print(json.dumps(q), flush=True)
                save()
    _env(HERE)
    return res


if __name__ == "__main__":
    main()
