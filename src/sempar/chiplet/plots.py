"""Figures of the simulator, named after the paper's (FSE-DP Figs. 11-18). Built in a temporary
folder beside the target and swapped in whole (`sempar.atomic.atomic_folder`): a failed run (a
full disk after two of four figures) leaves no figure and no folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sempar.atomic import atomic_folder


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_plots(out_dir: str | Path, results: dict, sweeps: dict | None, title: str,
                option: str = "--plot") -> list[str]:
    """results: name -> StrategyResult; sweeps: the dict of sweeps.py results (or None).

    Returns the paths written; `out_dir` follows the folder output rule (`option` names it)."""
    plt = _plt()
    out_dir = Path(out_dir)
    written: list[str] = []
    with atomic_folder(out_dir, "stream-plots", option=option) as tmp:
        names = list(results)

        fig, ax = plt.subplots(figsize=(7, 3.5))                       # Fig. 11
        for n in names:
            tl = results[n].timeline()
            if tl["t_s"]:
                ax.plot(np.array(tl["t_s"]) * 1e6, tl["utilization"], label=n, lw=1)
        ax.set(xlabel="time in layer (us)", ylabel="compute utilization", title=f"Fig. 11 - {title}")
        ax.legend(fontsize=6)
        fig.tight_layout(); fig.savefig(tmp / "fig11_utilization_timeline.png", dpi=120); plt.close(fig)

        fig, ax = plt.subplots(figsize=(7, 3.5))                       # Fig. 12
        ax.bar(range(len(names)), [results[n].peak_bytes / 2**20 for n in names])
        ax.axhline(32, color="k", ls="--", lw=0.8, label="32 MB (paper: FSE-DP below)")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=6)
        ax.set(ylabel="peak on-chip MiB", title=f"Fig. 12 - {title}"); ax.legend(fontsize=6)
        fig.tight_layout(); fig.savefig(tmp / "fig12_peak_memory.png", dpi=120); plt.close(fig)

        pick = next((n for n in ("fsedp+paired-load", "fsedp") if n in results), names[0])
        acts = results[pick].activity                                   # Fig. 13
        if acts:
            D = results[pick].dies
            fig, ax = plt.subplots(figsize=(8, 1 + 0.8 * D))
            colors = {"ddr": "tab:blue", "d2d": "tab:orange", "compute": "tab:green"}
            off = {"ddr": 0.0, "d2d": 0.27, "compute": 0.54}
            for kind, die, s, e, _ in acts:
                ax.broken_barh([(s * 1e6, (e - s) * 1e6)], (die + off[kind], 0.25), color=colors[kind])
            ax.set_yticks([d + 0.4 for d in range(D)], [f"die {d}" for d in range(D)])
            ax.set(xlabel="time (us)", title=f"Fig. 13 - {pick} activity (blue DDR, orange D2D, green compute)")
            fig.tight_layout(); fig.savefig(tmp / "fig13_activity.png", dpi=120); plt.close(fig)

        fig, ax = plt.subplots(figsize=(7, 3.5))                       # Figs. 14-15
        ax.bar(range(len(names)), [results[n].e2e_latency_s for n in names])
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=6)
        ax.set(ylabel="end-to-end latency (s)", title=f"Figs. 14-15 - {title}")
        fig.tight_layout(); fig.savefig(tmp / "fig14_e2e.png", dpi=120); plt.close(fig)

        if sweeps:
            for key, fname, xk, yk, zk in (("buffer_x_ddr", "fig16a_buffer_ddr.png", "ddr_gbps_per_die", "buffer_mb", "utilization"),
                                           ("ddr_x_d2d", "fig16b_ddr_d2d.png", "d2d_gbps", "ddr_gbps_per_die", "utilization"),
                                           ("microslice_x_buffer", "fig17_microslice_buffer.png", "buffer_mb", "micro_slices", "layer_latency_s")):
                if key not in sweeps:
                    continue
                sw = sweeps[key]
                z = np.array(sw[zk], float)
                fig, ax = plt.subplots(figsize=(5, 4))
                im = ax.imshow(z, origin="lower", aspect="auto", cmap="viridis")
                ax.set_xticks(range(len(sw[xk])), sw[xk]); ax.set_yticks(range(len(sw[yk])), sw[yk])
                if "feasible" in sw:
                    f = np.array(sw["feasible"])
                    for i, j in zip(*np.nonzero(f)):
                        ax.text(j, i, "*", ha="center", va="center", color="w")
                ax.set(xlabel=xk, ylabel=yk, title=f"{fname.split('_')[0]} ({zk}; * = eqs. 1-2 hold)")
                fig.colorbar(im); fig.tight_layout(); fig.savefig(tmp / fname, dpi=120); plt.close(fig)
            if "scaling" in sweeps:
                sw = sweeps["scaling"]
                fig, ax = plt.subplots(figsize=(5, 3.5))
                for s, u in sw["utilization"].items():
                    ax.plot(sw["meshes"], u, marker="o", label=s)
                ax.set(ylabel="utilization", title="Fig. 18 - scaling"); ax.legend(fontsize=7)
                fig.tight_layout(); fig.savefig(tmp / "fig18_scaling.png", dpi=120); plt.close(fig)

        written = [str(out_dir / f.name) for f in sorted(tmp.iterdir())]
    return written
