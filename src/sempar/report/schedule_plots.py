"""PNG plots of placement and online scheduling (each function returns the path it wrote)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sempar.report.figures import save_figure  # noqa: E402


def plot_lar_bars(rows: dict[str, dict[str, float]], path: Path, title: str,
                  series: tuple[str, ...] = ("lar_mean", "predicted_lar_mean", "oracle_lar_mean"),
                  labels: tuple[str, ...] = ("table (offline)", "online schedulers", "oracle")) -> Path:
    """Grouped bars: per method, its LAR under each placement of the tokens. rows: {method: figures}."""
    methods = list(rows)
    x = np.arange(len(methods))
    w = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(1.4 * len(methods) + 2.5, 3.4))
    for i, (key, label) in enumerate(zip(series, labels)):
        ax.bar(x + (i - (len(series) - 1) / 2) * w, [rows[m].get(key, np.nan) for m in methods],
               w, label=label)
    if "vanilla" in rows:
        ax.axhline(rows["vanilla"]["lar_mean"], color="grey", lw=0.8, ls="--", label="vanilla")
    ax.set_xticks(x, methods)
    ax.set_ylabel("LAR (held-out)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_policy_bars(policies: dict[str, dict[str, dict]], path: Path, title: str) -> Path:
    """Bars of dp LAR / round-robin per request policy, one group per arrival order.
    policies: {order: {policy: {"lar_ratio", "tokens_max_mean"}}}."""
    orders = list(policies)
    names = list(next(iter(policies.values())))
    x = np.arange(len(orders))
    w = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for i, n in enumerate(names):
        vals = [policies[o][n]["lar_ratio"] for o in orders]
        bars = ax.bar(x + (i - (len(names) - 1) / 2) * w, vals, w, label=n)
        for b, o in zip(bars, orders):
            ax.annotate(f"{policies[o][n]['tokens_max_mean']:.2f}", (b.get_x() + b.get_width() / 2,
                        b.get_height()), ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(x, orders)
    ax.set_ylabel("dp LAR / round-robin")
    ax.set_title(title + "\n(labels: per-rank tokens max/mean)", fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
