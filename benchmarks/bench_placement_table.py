"""The placement tables from `bench_placement.py --json` output (one or more files); also used by
`scripts/make_results.py`, which writes them into docs/results/placement.md with a stamp.

One table per (mode, R): a row per method, a column per case (trace, cluster shape); each cell
is `LAR (imbalance) share`, share = the LAR as a share of the method's own capacity-bound
oracle (the ceiling of that placement); a `ceiling` row gives the highest capacity-bound oracle
of any placement in the case (`ref:` of evaluate.ceiling_refs) and which placement reached it.
Cells of methods outside the imbalance budget (`bench_placement.BALANCE`) are marked `*`.
Lines of the files that are not the JSON report (a solver's own prints) are skipped.

    python benchmarks/bench_placement_table.py bp1.json [bp2.json ...]
"""

from __future__ import annotations

import json
import sys

from bench_placement import BALANCE


def tables(report: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = {}
    for case in report:
        groups.setdefault((case["mode"], case["redundant"] > 0), []).append(case)
    out = []
    for (mode, rep), cases in sorted(groups.items()):
        cols = [f"{c['trace'].replace('synthetic ', '')} {c['shape']}" for c in cases]
        methods = sorted({m for c in cases for m in c["methods"]},
                         key=lambda m: -max(c["methods"].get(m, {}).get("lar_mean", 0)
                                            for c in cases))
        out.append(f"{mode} mode" + (", R = G (one extra slot per device)" if rep else "")
                   + ": LAR (imbalance max/mean) share of its capacity-bound oracle\n")
        out.append("| method | " + " | ".join(cols) + " |")
        out.append("| --- |" + " --- |" * len(cols))
        for m in methods:
            cells = []
            for c in cases:
                r = c["methods"].get(m)
                cells.append("" if r is None else
                             f"{r['lar_mean']:.3f} ({r['imbalance_max_mean']:.2f}"
                             f"{'*' if r['imbalance_max_mean'] > BALANCE else ''}) "
                             f"{r['share_of_oracle']:.0%}")
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        ceil = []
        for c in cases:
            ref = next((v for k, v in c.get("refs", {}).items() if k.startswith(
                ("ref: capacity-bound", "ref: requests on best rank, balanced"))), None)
            ceil.append("" if ref is None else f"{ref['lar_mean']:.3f} ({ref['placement']})")
        out.append("| ceiling | " + " | ".join(ceil) + " |\n")
    return "\n".join(out)


def read_report(path) -> list[dict]:
    """The case list of one `bench_placement.py --json` output file (its first line that starts
    with `[`). Raises StopIteration when there is none, json.JSONDecodeError when it is not JSON."""
    with open(path) as f:          # HiGHS may print a line of its own to stdout: skipped
        return next(json.loads(line) for line in f if line.startswith("["))


def main() -> None:
    report = []
    for path in sys.argv[1:]:
        report += read_report(path)
    print(tables(report))


if __name__ == "__main__":
    main()
