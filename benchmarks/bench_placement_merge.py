"""`bench_placement.py`'s `--reuse` and `--merge` (issue 45): earlier `--json` outputs' figures
joined case by case with a new run's, so a loaded machine can run the methods, traces and
shapes as separate processes side by side and still get one report whose ceilings and verdicts
see every method."""

from __future__ import annotations

import json
from typing import Callable

from sempar.schedule.evaluate import ceiling_refs


def read_report(path) -> list[dict]:
    """The case list of one `bench_placement.py --json` output file (its first line that starts
    with `[`). Raises StopIteration when there is none, json.JSONDecodeError when it is not JSON."""
    with open(path) as f:          # HiGHS may print a line of its own to stdout: skipped
        return next(json.loads(line) for line in f if line.startswith("["))


def load_reuse(path: str, methods: list[str]) -> dict[tuple, dict]:
    """{(trace, shape, mode, R): {method: figures}} of an earlier `--json` output (`--reuse`),
    only the methods `methods` does not name (those are solved again)."""
    out = {}
    for c in read_report(path):
        if "cross" in c:
            continue
        keep = {m: r for m, r in c["methods"].items() if m not in methods}
        out[(c["trace"], c["shape"], c["mode"], c["redundant"])] = keep
    return out


def merge_reused(res: dict, figures: dict | None) -> None:
    """`res` (one mode's case) with the reused methods' figures added and its ceilings
    (`ref:`) recomputed over all of them; `reused` lists those methods."""
    if not figures:
        return
    res["methods"].update({m: r for m, r in figures.items() if m not in res["methods"]})
    res["reused"] = sorted(figures)
    refs = {k: v for k, v in res.get("refs", {}).items() if not k.startswith("ref: ")}
    res["refs"] = {**ceiling_refs(res["methods"], res["mode"]), **refs}


def merge_reports(reports: list[list[dict]], judge: Callable[[dict, str, str], list[str]]
                  ) -> list[dict]:
    """The cases of several `--json` outputs joined by (trace, shape, mode, R, homes): each
    method's figures from the first report that has them, the ceilings (`ref:`) and the R = 0
    verdicts recomputed on the union (R = G and cross-domain cases are kept as they are).
    judge(case, trace, homes): the verdict lines of one R = 0 case (bench_placement.judge_case;
    passed in, so this module imports nothing of bench_placement)."""
    import bench_placement_real as real

    out: dict[tuple, dict] = {}
    for report in reports:
        for c in report:
            key = (c["trace"], c["shape"], c["mode"], c["redundant"], c.get("homes"),
                   "cross" in c)
            if key not in out:
                out[key] = dict(c, methods=dict(c["methods"]))
                continue
            have = out[key]["methods"]
            have.update({m: r for m, r in c["methods"].items() if m not in have})
    for (name, _, _, redundant, homes, cross), c in out.items():
        if cross:
            continue
        refs = {k: v for k, v in c.get("refs", {}).items() if not k.startswith("ref: ")}
        c["refs"] = {**ceiling_refs(c["methods"], c["mode"]), **refs}
        if redundant == 0:
            kept = [v for v in c.get("verdict", []) if v.startswith("target 'predicted homes")]
            c["verdict"] = (judge(c, name, homes or "method")
                            + (real.paper_line(name, c) if c.get("real") else []) + kept)
    return list(out.values())
