"""Terminal tables for `sempar evaluate` (rich): the method table and the cross-dataset matrices."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from sempar.report.html import fmt

HEADS = {"lar_mean": "LAR", "lar_p50": "LAR p50", "predicted_lar_mean": "online LAR",
         "exact_lar_mean": "pre-routed LAR",
         "oracle_lar_mean": "oracle", "oracle_lar_unconstrained_mean": "oracle free",
         "node_local_rate": "node-local", "remote_copies_per_token": "remote copies",
         "imbalance_max_mean": "max/mean", "imbalance_max_median": "max/med",
         "batch_imbalance_max_mean": "step max/mean", "solve_seconds": "solve s"}


def print_evaluation(console: Console, result: dict) -> None:
    """One row per method: LAR (and online LAR), oracle LARs, copies, imbalance, solve time."""
    nodes = result["nodes"]
    replicas = f", R {result['redundant']}, dispatch {result.get('dispatch', 'nearest')}" \
        if result.get("redundant") else ""
    table = Table(title=f"EP {result['ep']}, {nodes} node(s), {result['mode']} mode{replicas}, "
                        f"held-out {result['eval']['tokens']} tokens (oracle: in-sample ceiling)")
    cols = ["lar_mean", "lar_p50", "oracle_lar_mean", "oracle_lar_unconstrained_mean",
            "remote_copies_per_token", "imbalance_max_mean", "imbalance_max_median",
            "batch_imbalance_max_mean", "solve_seconds"]
    if nodes > 1:
        cols.insert(4, "node_local_rate")
    online = any("predicted_lar_mean" in r for r in result["methods"].values())
    if online:
        cols[1:1] = ["predicted_lar_mean", "exact_lar_mean"]
    table.add_column("method")
    for c in cols:
        table.add_column(HEADS.get(c, c), justify="right")
    for name, r in result["methods"].items():
        table.add_row(name, *[fmt(r[c]) if c in r else "-" for c in cols])
    for label, r in result.get("refs", {}).items():       # ceilings: read each LAR as a share
        table.add_row(f"{label} ({r['placement']})", fmt(r["lar_mean"]), *["-"] * (len(cols) - 1))
    console.print(table)
    if online:
        acc = Table(title="online prediction accuracy of the device state (T, A, Alg. 3's choice); "
                    "pre-routed top-k = router's (selection agreement)")
        for c in ("method", "T", "A", "T|A", "pre-routed"):
            acc.add_column(c, justify="right" if c != "method" else "left")
        for name, r in result["methods"].items():
            if "accuracy" in r:
                a = r["accuracy"]
                acc.add_row(name, fmt(a["token"]), fmt(a["ngram"]), fmt(a["combined"]),
                            fmt(r.get("selection_agreement")))
        console.print(acc)
    for name, why in result.get("skipped", {}).items():
        console.print(f"skipped {name}: {why}")


def print_cross(console: Console, matrix: dict) -> None:
    """One fit-domain x eval-domain LAR table per method."""
    for name, m in matrix["methods"].items():
        table = Table(title=f"{name}: LAR, fit on row domain (20%), evaluate on column domain "
                            f"(diagonal: the other 80%); retention {fmt(m['retention'])}")
        table.add_column("fit \\ eval")
        for d in matrix["domains"]:
            table.add_column(d, justify="right")
        for d, row in zip(matrix["domains"], m["lar"]):
            table.add_row(d, *[fmt(v) for v in row])
        console.print(table)
