"""`sempar replay --plot`: the replay's time series as one PNG: exact-home LAR, device load
imbalance (mean over layers) and cumulative migrated bytes per step, one line per policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_replay(result: dict, path: str | Path) -> Path:
    """Write `result` (`drift.replay.replay`'s object) as a PNG at `path` (a fresh file in a
    folder the caller writes atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for name, p in result["policies"].items():
        x = [s["first_request"] for s in p["steps"]]
        axes[0].plot(x, [s["lar"] for s in p["steps"]], marker="o", ms=3, label=name)
        axes[1].plot(x, [s["imbalance"] for s in p["steps"]], marker="o", ms=3, label=name)
        axes[2].plot(x, np.cumsum([s["migrated_bytes"] for s in p["steps"]]) / 1e9, marker="o",
                     ms=3, label=name)
    axes[0].set_ylabel("exact-home LAR")
    axes[1].set_ylabel("imbalance (max/mean)")
    axes[1].axhline(1.10, color="k", ls="--", lw=1)
    axes[2].set_ylabel("migrated GB (cumulative)")
    axes[2].set_xlabel("request (stream order)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{result.get('model', '')}: EP {result['ep']}, update every {result['every']} "
                 f"requests from the last {result['window']}")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100, format="png")
    plt.close(fig)
    return out
