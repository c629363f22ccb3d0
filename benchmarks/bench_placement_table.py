"""The placement tables from `bench_placement.py --json` output (one or more files); also used by
`scripts/make_results.py`, which writes them into docs/results/placement.md with a stamp.

One table per (mode, R): a row per method, a column per case (trace, cluster shape); each cell
is `LAR (imbalance) share`, share = the LAR as a share of the method's own capacity-bound
oracle (the ceiling of that placement); a `ceiling` row gives the highest capacity-bound oracle
of any placement in the case (`ref:` of evaluate.ceiling_refs) and which placement reached it.
Cells of methods outside the imbalance budget (`bench_placement.BALANCE`) are marked `*`.
Cases judged on exact homes (`homes: exact`, the real traces) get their own tables: each cell is
the placement's capacity-bound oracle LAR and imbalance (exact pre-routing), its share of the
case's highest capacity-bound oracle, and a `best device` row (every token on its best device).
Cross-domain cases (`cross` key) get one table of in-domain / cross LAR and retained share.
Lines of the files that are not the JSON report (a solver's own prints) are skipped.

    python benchmarks/bench_placement_table.py bp1.json [bp2.json ...]
"""

from __future__ import annotations

import json
import sys

from bench_placement import BALANCE, FIGURES


def _cell(c: dict, r: dict | None, homes: str) -> str:
    if r is None:
        return ""
    lk, ik = FIGURES[homes]
    if homes == "method":
        share = r["share_of_oracle"]
    else:       # the exact figure's share of the case's capacity-bound ceiling
        ref = c.get("refs", {}).get("ref: capacity-bound oracle", {}).get("lar_mean")
        share = r[lk] / ref if ref else float("nan")
    return f"{r[lk]:.3f} ({r[ik]:.2f}{'*' if r[ik] > BALANCE else ''}) {share:.0%}"


def tables(report: list[dict]) -> str:
    """The method tables (one per mode, R and homes) and, when the report has them, the
    cross-domain table (markdown)."""
    groups: dict[tuple, list[dict]] = {}
    for case in report:
        if "cross" not in case:
            groups.setdefault((case["mode"], case["redundant"] > 0,
                               case.get("homes", "method")), []).append(case)
    out = []
    for (mode, rep, homes), cases in sorted(groups.items(), key=lambda kv: (
            kv[0][2] != "exact", kv[0][0], kv[0][1])):
        lk, _ = FIGURES[homes]
        cols = [f"{c['trace'].replace('synthetic ', '')} {c['shape']}" for c in cases]
        methods = sorted({m for c in cases for m in c["methods"]},
                         key=lambda m: -max(c["methods"].get(m, {}).get(lk, 0) for c in cases))
        out.append(f"{mode} mode" + (", R = G (one extra slot per device)" if rep else "")
                   + (": LAR (imbalance max/mean) share of its capacity-bound oracle\n"
                      if homes == "method" else
                      ", exact homes (each placement's capacity-bound oracle): LAR (imbalance "
                      "max/mean) share of the case's capacity-bound ceiling\n"))
        out.append("| method | " + " | ".join(cols) + " |")
        out.append("| --- |" + " --- |" * len(cols))
        for m in methods:
            cells = [_cell(c, c["methods"].get(m), homes) for c in cases]
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        rows = [("ceiling", ("ref: capacity-bound", "ref: requests on best rank, balanced"))]
        if homes == "exact":
            rows.append(("best device", ("ref: every token on its best device",)))
        for label, prefixes in rows:
            ceil = []
            for c in cases:
                ref = next((v for k, v in c.get("refs", {}).items() if k.startswith(prefixes)),
                           None)
                ceil.append("" if ref is None else f"{ref['lar_mean']:.3f} ({ref['placement']})")
            out.append(f"| {label} | " + " | ".join(ceil) + " |")
        out[-1] += "\n"
    cross = [c for c in report if "cross" in c]
    if cross:
        out.append(cross_table(cross))
    return "\n".join(out)


def cross_table(cases: list[dict]) -> str:
    """Cross-domain cases: in-domain LAR / cross LAR (retained share), cross imbalance."""
    cols = [f"{c['trace']} {c['shape']}" for c in cases]
    methods = sorted({m for c in cases for m in c["methods"]},
                     key=lambda m: -max(c["methods"].get(m, {}).get("cross_lar", 0) for c in cases))
    out = ["cross-domain, tp mode, R 0 (" + ", ".join(sorted({c.get("homes", "method")
                                                             for c in cases}))
           + " homes): in-domain LAR / cross LAR (retained share), cross imbalance\n",
           "| method | " + " | ".join(cols) + " |", "| --- |" + " --- |" * len(cols)]
    for m in methods:
        cells = []
        for c in cases:
            r = c["methods"].get(m)
            cells.append("" if r is None else f"{r['in_lar']:.3f} / {r['cross_lar']:.3f} "
                         f"({r['retained']:.2f}), {r['cross_imbalance']:.2f}")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    out.append("| folds (eval <- fit) | " + " | ".join(
        "; ".join(f"{len(f['eval_domains'])} <- {len(f['fit_domains'])} domains"
                  if len(f["eval_domains"]) > 1 else
                  f"{f['eval_domains'][0]} <- {'+'.join(f['fit_domains'])}"
                  for f in c["cross"]["folds"]) for c in cases) + " |\n")
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
