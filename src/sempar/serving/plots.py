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
    return _save(fig, path)


def plot_gains(results: list[dict], path: str | Path) -> Path:
    """The demo's answer as one chart: per plan (model x topology) a panel of horizontal bars,
    the throughput under the SLO of every deployment forecast in full as a ratio to SGLang's
    launch (x SGLang), whiskers from the rate search's interval (serving.report._ratio_interval),
    the recommended one dark; below them the attribution's steps (balance, locality, request
    policy, pipeline), each a ratio to the step before. `results`: `plan` results."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sempar.serving.report import _ratio_interval

    n = len(results)
    cols = 2 if n > 1 else 1
    rows_n = -(-n // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(6.2 * cols, 3.6 * rows_n), squeeze=False)
    for ax, res in zip(axes.ravel(), results):
        base = res["baseline"]
        labels, val, lo, hi, colors = [], [], [], [], []
        for i, r in enumerate(res["ranked"]):
            ratio, low, high = _ratio_interval(r, base)
            labels.append(f"{r['placement']}/{r['pipeline']}/{r['policy']} R={r['redundant']}")
            val.append(ratio or 0.0)
            lo.append(max(0.0, (ratio or 0) - (low if low is not None else ratio or 0)))
            hi.append(max(0.0, (high if high is not None else ratio or 0) - (ratio or 0)))
            colors.append("#1f4e79" if i == 0 else "#7fa7cf")
        for p in res.get("attribution") or []:
            if p.get("gain"):
                labels.append(f"step: {p['part']}")
                val.append(p["gain"])
                lo.append(0.0)
                hi.append(0.0)
                colors.append("#c07a2c")
        y = list(range(len(labels)))[::-1]
        bars = ax.barh(y, val, xerr=[lo, hi], color=colors, capsize=3)
        ax.bar_label(bars, labels=[f"{v:.2f}x" for v in val], fontsize=7, padding=8)
        ax.axvline(1.0, color="k", lw=1)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xlabel("x SGLang's launch under the SLO (steps: x the step before)", fontsize=8)
        ax.set_title(f"{res['model']} on {res['topology']}", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    """Lay `fig` out, write it atomically as a PNG at `path`, close it."""
    import matplotlib.pyplot as plt

    from sempar.atomic import atomic_path

    fig.tight_layout()
    out = Path(path)
    with atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return out
