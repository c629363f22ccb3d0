"""Write docs/results/*.md from benchmarks' `--json` output, stamped; never edit those pages by hand.

    python scripts/make_results.py BENCH.json [BENCH2.json ...] --out docs/results/ \
        [--command "python benchmarks/bench_placement.py --json ..."] [--note "short run: ..."]

Each input file is recognised by its content (KINDS: `stats`, the results file of
`benchmarks/bench_stats.py --json`; `placement-real`, the case list of
`benchmarks/bench_placement.py --real-only --json`, every case `real`; `placement`, any other
case list of `benchmarks/bench_placement.py --json`); files of one kind are concatenated into one page,
`OUT/<kind>.md`, whose tables come from the benchmark's own formatter
(`benchmarks/bench_placement_table.tables`). The stamp names the commit (HEAD; `-dirty` when
src/ or benchmarks/ differ from it, i.e. the code that measured is not the commit's), when the
benchmark output was written (the newest input's mtime, UTC), when the page was generated, the
machine (usable CPUs as `nproc` counts them, CPU model name) and the load average at generation
(1 / 5 / 15 min: run the generator right after the benchmark so the 15-min figure covers it).

Bad input (a missing or unreadable file, a file that is not one of KINDS' JSON): one line on
stderr naming the file, exit code 2, no page written. Pages are written to a temporary beside
the target and renamed over it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_placement_table  # noqa: E402  (benchmarks/ is not a package)
import bench_stats  # noqa: E402
from results_stamp import stamp  # noqa: E402


class BadInput(Exception):
    """One line naming the input that is wrong (exit code 2)."""


def _is_placement(data) -> bool:
    return (isinstance(data, list) and bool(data) and all(
        isinstance(c, dict) and {"trace", "shape", "mode", "redundant", "methods"} <= c.keys()
        for c in data))


def _is_placement_real(data) -> bool:
    return _is_placement(data) and all(c.get("real") for c in data)


def _placement_body(report: list[dict]) -> str:
    lines = [bench_placement_table.tables(report), "Verdicts (`bench_placement.py`, per case):", ""]
    for c in report:
        what = "cross-domain" if "cross" in c else f"R {c['redundant']}"
        homes = f", {c['homes']} homes" if "homes" in c else ""
        lines.append(f"- {c['trace']} {c['shape']}, {c['mode']} mode, {what}{homes}: "
                     + "; ".join(c.get("verdict", [])))
    return "\n".join(lines) + "\n"


def _is_tp_gap(data) -> bool:
    return (isinstance(data, list) and bool(data) and all(
        isinstance(c, dict) and c.get("table") in ("tp-gap", "semmoe-tp") for c in data))


def _tp_gap_body(rows: list[dict]) -> str:
    import bench_tp_gap     # imports sempar: only when such a page is written

    return bench_tp_gap.tables(rows)


def _is_home_rules(data) -> bool:
    return (isinstance(data, list) and bool(data) and all(
        isinstance(c, dict) and {"trace", "ep", "held_out_proposal", "held_out_optimal"}
        <= c.keys() for c in data))


def _home_rules_body(rows: list[dict]) -> str:
    import bench_home_rules     # imports sempar: only when such a page is written

    return bench_home_rules.table(rows) + "\n"


def _is_drift_engines(data) -> bool:
    return (isinstance(data, list) and bool(data) and all(
        isinstance(c, dict) and {"suite", "stream", "policies", "verdicts"} <= c.keys()
        for c in data))


def _drift_engines_body(rows: list[dict]) -> str:
    import bench_drift_engines     # imports nothing of sempar at module level

    return bench_drift_engines.tables(rows)


def _is_eplb_plugin(data) -> bool:
    return (isinstance(data, list) and bool(data) and all(
        isinstance(c, dict) and c.get("benchmark") == "eplb-plugin" for c in data))


def _eplb_plugin_body(rows: list[dict]) -> str:
    import bench_eplb_plugin     # imports numpy only at module level

    return bench_eplb_plugin.tables(rows)


def _is_demo(data) -> bool:
    return isinstance(data, dict) and {"stages", "seconds"} <= data.keys() \
        and "serve" in data["stages"]


def _demo_body(runs: list[dict]) -> str:
    """The answer `sempar demo` prints, then each stage's wall and CPU seconds."""
    from sempar.serving.report import answer_line     # imports sempar: only for this page

    lines = []
    for run in runs:
        cases = (run["stages"].get("serve") or {}).get("cases", [])
        lines += ["The answer `sempar demo` prints (forecast; gain over SGLang's launch under "
                  "the SLO, [interval]):", ""]
        lines += [f"- {answer_line(c)}" for c in cases]
        cpu = run.get("cpu_seconds", {})
        lines += ["", "| stage | wall s | CPU s |", "| --- | ---: | ---: |"]
        lines += [f"| {k} | {v:.1f} | {cpu[k]:.1f} |" if k in cpu else f"| {k} | {v:.1f} | |"
                  for k, v in run["seconds"].items()]
        lines += [f"| total | {sum(run['seconds'].values()):.1f} | "
                  + (f"{sum(cpu.values()):.1f} |" if cpu else "|"), ""]
    return "\n".join(lines) + "\n"


def _is_optimality(data) -> bool:
    return (isinstance(data, list) and bool(data) and all(
        isinstance(c, dict) and {"trace", "ep", "in_sample", "bound", "gap"} <= c.keys()
        for c in data))


def _optimality_body(rows: list[dict]) -> str:
    import bench_rows_speed     # imports sempar: only when such a page is written

    return bench_rows_speed.gap_table(rows) + "\n"


# kind -> (recogniser, page title, benchmark that writes it, body formatter)
def _is_stats(data) -> bool:
    return (isinstance(data, dict) and isinstance(data.get("runs"), list)
            and all(isinstance(r, dict) and {"tokens", "shards", "build"} <= r.keys()
                    for r in data["runs"])
            and (bool(data["runs"]) or isinstance(data.get("side_by_side"), dict)))


def _stats_body(docs: list[dict]) -> str:
    return "\n".join(bench_stats.body(d) for d in docs) + "\n"


KINDS = {      # the first whose recogniser accepts a file names its page
    "placement-real": (_is_placement_real, "Placement quality on real routing (held out)",
                       "benchmarks/bench_placement.py --real-only --json", _placement_body),
    "placement": (_is_placement, "Placement quality on held-out routing",
                  "benchmarks/bench_placement.py --json", _placement_body),
    "demo": (_is_demo, "`sempar demo`: the answer and where its time goes",
             "sempar demo (its summary.json)", _demo_body),


    "optimality-bound": (_is_optimality, "How far from optimal: the certified ratio "
                         "(in-sample exact-home LAR / an upper bound for any placement)",
                         "benchmarks/bench_rows_speed.py --cases dsv2 gpt --paths new hypergraph "
                         "--json", _optimality_body),
    "home-rules": (_is_home_rules, "The capacity-bound home rules: greedy proposal rounds "
                   "against the optimal assignment (held out)",
                   "benchmarks/bench_home_rules.py --json", _home_rules_body),
    "tp-gap": (_is_tp_gap, "The Attention-TP gap, term by term, and Sem-MoE's TP setting",
               "benchmarks/bench_tp_gap.py --json", _tp_gap_body),
    "drift-engines": (_is_drift_engines, "The engines' balancers and replica slots under drift",
                      "benchmarks/bench_drift_engines.py --json", _drift_engines_body),
    "stats": (_is_stats, "Routing statistics: build + solve",
              "benchmarks/bench_stats.py --json", _stats_body),
    "eplb-plugin": (_is_eplb_plugin, "sempar's EPLB plug-in against the engines' own balancer",
                    "benchmarks/bench_eplb_plugin.py --json", _eplb_plugin_body),
}


def read_input(path: str):
    """(kind, data) of one benchmark JSON file; BadInput when it is not one of KINDS'."""
    try:
        with open(path) as f:
            # a solver may print a line of its own to stdout before the JSON: skipped
            line = next((ln for ln in f if ln.lstrip().startswith(("[", "{"))), None)
    except OSError as e:
        raise BadInput(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not a text file") from None
    if line is None:
        raise BadInput(f"{path}: no JSON line (expected a benchmark's --json output)")
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        try:                            # an indented file (the demo's summary.json): whole
            with open(path) as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadInput(f"{path}: not JSON ({e.msg} at column {e.colno})") from None
    for kind, (recognise, *_rest) in KINDS.items():
        if recognise(data):
            return kind, data if isinstance(data, list) else [data]
    raise BadInput(f"{path}: not the --json output of a benchmark this script knows "
                   f"({', '.join(v[2] for v in KINDS.values())})")


def page(kind: str, data: list, inputs: list[str], command: str | None, note: str | None) -> str:
    _, title, bench, body = KINDS[kind]
    return (f"# {title}\n\n"
            + stamp("scripts/make_results.py", bench, inputs, command, note) + "\n" + body(data))


def _write(target: Path, text: str) -> None:
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="benchmark --json output files")
    ap.add_argument("--out", required=True, help="folder for the pages (docs/results/)")
    ap.add_argument("--command", help="the benchmark command line, printed on the page")
    ap.add_argument("--note", help="what the run covers (e.g. 'short run: one trace, one shape')")
    args = ap.parse_args(argv)
    try:
        by_kind: dict[str, tuple[list, list[str]]] = {}
        for path in args.inputs:
            kind, data = read_input(path)
            report, paths = by_kind.setdefault(kind, ([], []))
            report += data
            paths.append(path)
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise BadInput(f"--out {out}: not a folder")
        pages = {out / f"{kind}.md": page(kind, report, paths, args.command, args.note)
                 for kind, (report, paths) in by_kind.items()}
        out.mkdir(parents=True, exist_ok=True)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: --out {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    for target, text in pages.items():
        _write(target, text)
        print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
