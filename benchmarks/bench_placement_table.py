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

import sys

from bench_placement import BALANCE, FIGURES
from bench_placement_merge import read_report


def _cell(c: dict, r: dict | None, homes: str) -> str:
    if r is None:
        return ""
    lk, ik = FIGURES[homes]
    if homes == "method":
        share = r["share_of_oracle"]
    else:       # the exact figure's share of the case's capacity-bound ceiling
        ref = _ceiling(c)
        if not ref:     # no ceiling recorded: no share (never a `nan%`)
            return f"{r[lk]:.3f} ({r[ik]:.2f}{'*' if r[ik] > BALANCE else ''})"
        share = r[lk] / ref["lar_mean"]
    return f"{r[lk]:.3f} ({r[ik]:.2f}{'*' if r[ik] > BALANCE else ''}) {share:.0%}"


# the case's capacity-bound ceiling: tp mode names it "capacity-bound oracle", dp mode
# "requests on best rank, balanced" (evaluate.ceiling_refs); the dp tables once looked up only
# the tp name and printed `nan%`
CEILING = ("ref: capacity-bound", "ref: requests on best rank, balanced")


def _ceiling(c: dict) -> dict | None:
    """The case's capacity-bound ceiling ref ({"lar_mean", "placement"}), or None."""
    return next((v for k, v in c.get("refs", {}).items() if k.startswith(CEILING)
                 and v.get("lar_mean")), None)


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
        rows = [("ceiling", CEILING)]
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
    held = held_out_table(report)
    if held:
        out.append(held)
    cross = [c for c in report if "cross" in c]
    if cross:
        out.append(cross_table(cross))
    return "\n".join(out)


def held_out_table(report: list[dict]) -> str:
    """Exact-home cases where `sempar` records its held-out prediction (placement/sempar/
    held_out.py): the fit cap, predicted imbalance (upper), the held-out imbalance and the gap,
    `within_budget`, sempar's LAR and the best other deployable method within the budget
    (`bench_placement.BALANCE`); "" when no case has one."""
    rows = []
    for c in report:
        s = c.get("methods", {}).get("sempar")
        if "cross" in c or c.get("homes") != "exact" or not s or "held_out" not in s:
            continue
        h, lk, ik = s["held_out"], *FIGURES["exact"]
        rivals = sorted(((m, r) for m, r in c["methods"].items()
                         if m not in ("sempar", "oracle") and r[ik] <= BALANCE),
                        key=lambda kv: -kv[1][lk])
        best = (f"{rivals[0][0]} {rivals[0][1][lk]:.3f} ({rivals[0][1][ik]:.3f})" if rivals
                else "none within")
        lead = f"{s[lk] - rivals[0][1][lk]:+.3f}" if rivals and s[ik] <= BALANCE else ""
        pred = h.get("predicted_imbalance")
        gap = f"{pred - s[ik]:+.3f}" if pred is not None else ""
        rows.append(f"| {c['trace']} {c['shape']} | {c['mode']} | {c['redundant']} | "
                    f"{h.get('fit_cap', float('nan')):.3f} | {pred:.3f} "
                    f"({h.get('predicted_upper', float('nan')):.3f}) | {s[ik]:.3f} | {gap} | "
                    f"{'yes' if h.get('within_budget') else 'no'} | {s[lk]:.3f} | {best} | "
                    f"{lead} |")
    if not rows:
        return ""
    return "\n".join([
        f"sempar's held-out prediction (exact homes): fit cap solved at, predicted imbalance "
        f"(upper, the promise), held-out imbalance, predicted - held out, within_budget (the "
        f"promise <= {BALANCE}), sempar's LAR, the best other method within {BALANCE} "
        f"(LAR (imbalance)) and sempar's lead over it (where sempar is within)\n",
        "| case | mode | R | fit cap | predicted (upper) | held out | gap | within_budget | "
        "sempar LAR | best other within | lead |",
        "| --- |" + " --- |" * 10, *rows]) + "\n"


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


def main() -> None:
    report = []
    for path in sys.argv[1:]:
        report += read_report(path)
    print(tables(report))


if __name__ == "__main__":
    main()
