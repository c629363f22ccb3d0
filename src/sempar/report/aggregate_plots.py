"""Plots of `sempar.affinity.aggregates.analyze_aggregates` (real OLMoE / Mixtral aggregates).

Per model (files ``real-<model>-<what>.png`` in `out_dir`):

- ``hotness``: per analysed layer, cumulative hotness of the static top-k and max hotness of the
  non-top-k (bars at p50, whiskers p25..p75, pooled over domains), the uniform-routing p50 as a
  tick, and Sem-MoE Table 1's DeepSeek-V2-Lite p50 range of the cumulative hotness (0.833-0.976)
  shaded (Sem-MoE §3.2);
- ``crosslayer``: heatmaps of P(E_second | E_first) for each analysed layer pair (ExFlow Fig. 2);
- ``domain-js``: the Jensen-Shannon distance between domains' expert distributions at the middle
  analysed layer (Sem-MoE A.1).

A plot whose data the result lacks (e.g. the SFT/DPO models have expert counts only) is skipped.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: set before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

SEMMOE_P50_RANGE = (0.833, 0.976)   # Sem-MoE Table 1, DeepSeek-V2-Lite, p50 cum hotness (top-k)


def _save(fig, path: Path) -> Path:
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def _hotness(key: str, m: dict, path: Path) -> Path | None:
    rows = [r for r in m.get("layers", [])
            if (r.get("cum_hotness_topk") or {}).get("p50") is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 + 1.3 * len(rows)), 4))
    x = np.arange(len(rows))
    w = 0.38
    ax.axhspan(*SEMMOE_P50_RANGE, color="tab:green", alpha=0.15,
               label="DeepSeek-V2-Lite p50 cum. hotness (Sem-MoE Tab. 1)")
    series = ((-w / 2, "cum_hotness_topk", "tab:blue", "cum. hotness top-k"),
              (w / 2, "max_hotness_non_topk", "tab:orange", "max hotness non-top-k"))
    for off, metric, color, label in series:
        q = np.array([[r[metric]["p25"], r[metric]["p50"], r[metric]["p75"]] for r in rows])
        ax.bar(x + off, q[:, 1], w, color=color, label=f"{label} (p50, p25-p75)",
               yerr=[q[:, 1] - q[:, 0], q[:, 2] - q[:, 1]], capsize=3)
        uni = [(r.get("uniform") or {}).get(f"{metric}_p50") for r in rows]
        if all(u is not None for u in uni):
            ax.scatter(x + off, uni, marker="_", s=300, color="k", zorder=3,
                       label="uniform routing p50" if off < 0 else None)
    ax.set_xticks(x, [f"layer {r['layer']}" for r in rows])
    ax.set_ylim(0, 1)
    ax.set_ylabel("hotness")
    ax.set_title(f"{m.get('model', key)}: token -> expert concentration "
                 f"(N={m.get('num_experts')}, k={m.get('top_k')})", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.tight_layout()
    return _save(fig, path)


def _crosslayer(key: str, m: dict, path: Path) -> Path | None:
    pairs = [e for e in m.get("crosslayer", []) if e.get("matrix")]
    if not pairs:
        return None
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.4 * len(pairs), 4), squeeze=False)
    for ax, e in zip(axes[0], pairs):
        im = ax.imshow(np.asarray(e["matrix"]), cmap="Reds", vmin=0, aspect="auto")
        ax.set_xlabel(f"expert at layer {e['to']}")
        ax.set_ylabel(f"expert at layer {e['from']}")
        mass = e.get("topk_mass", float("nan"))
        ax.set_title(f"P(E{e['to']} | E{e['from']}): top-k mass {mass:.2f} "
                     f"(uniform {e['uniform']:.2f})", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"{m.get('model', key)}: inter-layer affinity (rank-aligned pairs)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def _domain_js(key: str, m: dict, path: Path) -> Path | None:
    js, names = m.get("domain_js") or {}, m.get("domain_js_domains") or []
    if not js or len(names) < 2:
        return None
    layers = sorted(js, key=int)
    layer = layers[len(layers) // 2]
    mat = np.asarray(js[layer])
    fig, ax = plt.subplots(figsize=(1.5 + 0.7 * len(names), 1.1 + 0.7 * len(names)))
    im = ax.imshow(mat, cmap="viridis", vmin=0, vmax=max(float(mat.max()), 1e-9))
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    for i in range(len(names)):
        for j in range(len(names)):
            ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=7,
                    color="w" if mat[i, j] < 0.6 * mat.max() else "k")
    ax.set_title(f"{m.get('model', key)}: JS distance of expert load, layer {layer}", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return _save(fig, path)


def plot_aggregates(result: dict, out_dir: Path) -> list[Path]:
    """Write the PNGs described in the module docstring for every model of `result`.

    result: the dict of `analyze_aggregates`; returns the paths written (out_dir is created).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, m in result.get("models", {}).items():
        for what, fn in (("hotness", _hotness), ("crosslayer", _crosslayer),
                         ("domain-js", _domain_js)):
            path = fn(key, m, out_dir / f"real-{key}-{what}.png")
            if path is not None:
                written.append(path)
    return written
