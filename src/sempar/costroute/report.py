"""Tables and the Pareto plot of a lambda sweep (`sweep.run_sweeps` results).

CAMoE's figures for comparison (Qwen3-30B-A3B, its 4-GPU emulated cloud, lambda = 0.25):
mean all-to-all -15.8%, p95 -19.1%, average accuracy over nine tasks -1.2 points (Table 1);
Table 2: cv 0.3368 -> 0.3742, avg_layer_cv ~1.51 flat, KL 0 -> 0.0149, avg_layer_kl <= 0.0588.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

CAMOE = {"model": "Qwen3-30B-A3B", "lambda": 0.25, "a2a_mean_change": -0.158,
         "a2a_p95_change": -0.191, "acc_change_points": -1.2, "kl": 0.0149,
         "avg_layer_kl": 0.0588, "cv": (0.3368, 0.3742), "avg_layer_cv": 1.51}

COLUMNS = ["lambda", "a2a mean", "mean chg", "a2a p95", "p95 chg", "KL", "layer KL", "cv",
           "layer cv", "local", "imbal", "ppl", "acc %", "acc chg pt"]


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms" if x >= 1e-4 else f"{x * 1e6:.2f} us"


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per lambda with the columns `COLUMNS` (strings, for rich / markdown)."""
    rows = []
    for p in result["points"]:
        rows.append([f"{p['lambda']:.2f}", _ms(p["a2a_mean_s"]), f"{100 * p['a2a_mean_change']:+.1f}%",
                     _ms(p["a2a_p95_s"]), f"{100 * p['a2a_p95_change']:+.1f}%", f"{p['kl']:.4f}",
                     f"{p['avg_layer_kl']:.4f}", f"{p['cv']:.3f}", f"{p['avg_layer_cv']:.3f}",
                     f"{p['local_rate']:.3f}", f"{p['imbalance_max_mean']:.2f}",
                     f"{p['ppl_mean']:.2f}", f"{100 * p['acc_mean']:.2f}",
                     f"{p['acc_change_points']:+.2f}"])
    return rows


def layer_rows(result: dict[str, Any]) -> list[list[str]]:
    """Per layer: mean and p95 all-to-all change at every lambda ("mean/p95" in %)."""
    pts = result["points"]
    rows = []
    for l in range(len(pts[0]["layers"])):
        row = [str(l)]
        for p in pts[1:]:
            lp = p["layers"][l]
            row.append(f"{100 * lp['a2a_mean_change']:+.1f}/{100 * lp['a2a_p95_change']:+.1f}")
        rows.append(row)
    return rows


def pareto_line(result: dict[str, Any]) -> str:
    par = result["pareto"]
    return (f"{result['model']} on {result['topology']}: Pareto point lambda = {par['lambda']:g} "
            f"(mean {100 * par['a2a_mean_change']:+.1f}%, p95 {100 * par['a2a_p95_change']:+.1f}%, "
            f"accuracy {par['acc_change_points']:+.2f} points, perplexity "
            f"{100 * par['ppl_change']:+.1f}%); front: {', '.join(f'{x:g}' for x in par['front'])}")


def pareto_plot(sweep_result: dict[str, Any] | Sequence[dict[str, Any]], path: str | Path) -> Path:
    """PNG: per (model, topology), mean all-to-all change (%) against the accuracy change
    (points) and p95 change against the perplexity change, each lambda labelled, the Pareto
    point starred, CAMoE's lambda = 0.25 point for reference. Returns `path`."""
    from sempar.report.figures import plt, save_figure

    results = [sweep_result] if isinstance(sweep_result, dict) else list(sweep_result)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for r in results:
        pts = r["points"]
        label = f"{r['model']} / {r['topology']}"
        x = [100 * p["a2a_mean_change"] for p in pts]
        y = [p["acc_change_points"] for p in pts]
        x2 = [100 * p["a2a_p95_change"] for p in pts]
        y2 = [100 * p["ppl_change"] for p in pts]
        line, = axes[0].plot(x, y, "o-", label=label)
        axes[1].plot(x2, y2, "o-", color=line.get_color(), label=label)
        for p, a, b in zip(pts, x, y):
            axes[0].annotate(f"{p['lambda']:g}", (a, b), fontsize=7, xytext=(3, 3),
                             textcoords="offset points")
        best = next(p for p in pts if p["lambda"] == r["pareto"]["lambda"])
        axes[0].plot([100 * best["a2a_mean_change"]], [best["acc_change_points"]], "*",
                     color=line.get_color(), markersize=14)
    axes[0].plot([100 * CAMOE["a2a_mean_change"]], [CAMOE["acc_change_points"]], "kx",
                 markersize=10, label="CAMoE (Qwen3-30B-A3B, lambda 0.25)")
    axes[1].plot([100 * CAMOE["a2a_p95_change"]], [0.0], "kx", markersize=10,
                 label="CAMoE p95 (no perplexity reported)")
    axes[0].set_xlabel("mean all-to-all per MoE layer, change vs lambda = 0 (%)")
    axes[0].set_ylabel("next-token accuracy, change (points)")
    axes[0].set_title("Cost-aware routing: latency vs accuracy (star = Pareto point)")
    axes[1].set_xlabel("p95 all-to-all per MoE layer, change vs lambda = 0 (%)")
    axes[1].set_ylabel("perplexity, change (%)")
    axes[1].set_title("tail latency vs perplexity")
    for ax in axes:
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(fig, Path(path))
