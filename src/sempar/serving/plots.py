"""Latency-throughput curves of `serve-sim` as one PNG (Sem-MoE Fig. 4, s-MoE Fig. 4 style):
one panel per SLO statistic, token throughput on x, the statistic on y (log), one line per
system, the SLO as a dashed line; written atomically."""

from __future__ import annotations

from pathlib import Path

from sempar.serving.metrics import SLO_KEYS, SLO_STAT

LABELS = {"ttft": "p99 TTFT (s)", "tpot": "mean TPOT (s)", "p90_tbt": "p90 TBT (s)",
          "e2e": "median E2E (s)"}


def plot_curves(result: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sempar.atomic import atomic_path

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, key in zip(axes.ravel(), SLO_KEYS):
        stat = SLO_STAT[key]
        for name, s in result["systems"].items():
            pts = [p for p in s["curve"] if p.get(stat) is not None]
            ax.plot([p["throughput"] for p in pts], [p[stat] for p in pts], marker="o", ms=3,
                    label=name)
        ax.axhline(result["slos"][key], color="k", ls="--", lw=1, label="SLO")
        ax.set_yscale("log")
        ax.set_xlabel("token throughput (tokens/s)")
        ax.set_ylabel(LABELS[key])
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"{result['model']} on {result['topology']}, {result['accelerator']} x "
                 f"{result['ep']} (SLO = {result['slo_scale']:g} x lightest load)")
    fig.tight_layout()
    out = Path(path)
    with atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return out
