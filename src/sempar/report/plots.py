"""PNG plots of `sempar analyze` (one function per figure; each returns the path it wrote)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sempar.report.figures import save_figure  # noqa: E402

from sempar.affinity.analysis import TraceAnalysis  # noqa: E402

# Sem-MoE Table 1 (DeepSeek-V2-Lite): p50 ranges over its layers, drawn as references.
PAPER_CUM_HOTNESS_P50 = (0.833, 0.976)
PAPER_MAX_NON_TOPK_P50 = 0.05
PAPER_KURTOSIS = 8.0           # Sem-MoE A.2: "most kurtosis values are higher than 8"
PAPER_LOOKBACK5 = 0.70         # Sem-MoE A.2: about 70% when looking back 5 layers


def plot_table1(a: TraceAnalysis, path: Path) -> Path:
    """Per-layer p25/p50/p75 of F1, cumulative top-k hotness and max non-top-k hotness."""
    x = [l["layer"] for l in a.layers]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharex=True)
    for ax, key, title in zip(axes, ("f1", "cum_hotness_topk", "max_hotness_non_topk"),
                              ("F1 of the static top-k", "cumulative hotness of top-k",
                               "max hotness of non-top-k")):
        q = {p: np.array([np.nan if l[key][p] is None else l[key][p] for l in a.layers])
             for p in ("p25", "p50", "p75")}
        ax.fill_between(x, q["p25"], q["p75"], alpha=0.3, label="p25-p75")
        ax.plot(x, q["p50"], marker=".", label="p50")
        if key == "cum_hotness_topk":
            ax.axhspan(*PAPER_CUM_HOTNESS_P50, color="tab:green", alpha=0.12,
                       label="Sem-MoE p50 range")
        if key == "max_hotness_non_topk":
            ax.axhline(PAPER_MAX_NON_TOPK_P50, color="tab:green", ls="--", label="Sem-MoE p50")
        ax.set_title(title)
        ax.set_xlabel("MoE layer")
        ax.set_ylim(0, 1.05 if key != "max_hotness_non_topk" else None)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_kurtosis(a: TraceAnalysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    if a.kurtosis_mid.size:
        ax.hist(a.kurtosis_mid, bins=50, color="tab:blue", alpha=0.8)
    ax.axvline(PAPER_KURTOSIS, color="tab:red", ls="--", label="8 (Sem-MoE A.2)")
    ax.set_xlabel("Pearson kurtosis of a token's activation map")
    ax.set_ylabel("tokens")
    ax.set_title(f"layer {a.layers[len(a.layers) // 2]['layer']}")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_transitions(a: TraceAnalysis, path: Path) -> Path:
    """P(E_{l+1} | E_l) heatmaps at expert level (top) and device level (bottom)."""
    n = len(a.transition_layers)
    fig, axes = plt.subplots(2, max(n, 1), figsize=(4.2 * max(n, 1), 7.6), squeeze=False)
    layer_ids = [l["layer"] for l in a.layers]
    for j, (l0, l1) in enumerate(a.transition_layers):
        for i, (mats, level) in enumerate(((a.transition_expert, "expert"),
                                           (a.transition_device, "device"))):
            ax = axes[i, j]
            im = ax.imshow(mats[j], cmap="viridis", aspect="auto", interpolation="nearest")
            ax.set_title(f"{level}: P(layer {layer_ids[l1]} | layer {layer_ids[l0]})", fontsize=9)
            ax.set_xlabel(f"{level} at layer {layer_ids[l1]}")
            ax.set_ylabel(f"{level} at layer {layer_ids[l0]}")
            fig.colorbar(im, ax=ax, fraction=0.046)
    return save_figure(fig, path)


def plot_lookback(a: TraceAnalysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    n = np.arange(1, len(a.lookback_expert) + 1)
    for vals, label in ((a.lookback_expert, "expert (top-k overlap)"),
                        (a.lookback_device, f"device (G={a.devices}, exact)")):
        ax.plot(n, [np.nan if v is None else v for v in vals], marker="o", label=label)
    ax.axhline(PAPER_LOOKBACK5, color="tab:green", ls="--", label="~70% (Sem-MoE A.2)")
    ax.set_xlabel("look-back layers")
    ax.set_ylabel("prediction accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_requests(a: TraceAnalysis, domains: list[str], path: Path) -> Path | None:
    e = a.embedding
    if e is None or e.xy.shape[0] == 0:
        return None
    fig, ax = plt.subplots(figsize=(5.4, 4.4))
    for d in np.unique(e.domain):
        sel = e.domain == d
        name = domains[d] if 0 <= d < len(domains) else "unknown"
        ax.scatter(e.xy[sel, 0], e.xy[sel, 1], s=8, alpha=0.7, label=name)
    ax.set_title("requests by expert activation (t-SNE)")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(fontsize=7, markerscale=2)
    return save_figure(fig, path)


def plot_load_tail(a: TraceAnalysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.4, 3.6))
    for B, d in a.long_tail.items():
        curve = np.asarray(d["sorted_load"])
        ax.plot(np.arange(1, curve.size + 1), curve / max(curve.sum(), 1e-12), label=f"{B} tokens")
    ax.set_yscale("log")
    ax.set_xlabel("experts, sorted by load")
    ax.set_ylabel("share of the batch's selections")
    ax.set_title("per-batch expert load (FSE-DP Fig. 2)")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_analysis(a: TraceAnalysis, out_dir: Path, domains: list[str]) -> dict[str, Path]:
    """Every figure of the analysis into out_dir; returns {name: path}."""
    out_dir = Path(out_dir)
    paths = {
        "table1": plot_table1(a, out_dir / "table1.png"),
        "kurtosis": plot_kurtosis(a, out_dir / "kurtosis.png"),
        "transitions": plot_transitions(a, out_dir / "transitions.png"),
        "lookback": plot_lookback(a, out_dir / "lookback.png"),
        "load_tail": plot_load_tail(a, out_dir / "load_tail.png"),
    }
    req = plot_requests(a, domains, out_dir / "requests.png")
    if req is not None:
        paths["requests"] = req
    return paths
