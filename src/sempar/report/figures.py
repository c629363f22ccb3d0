"""Shared matplotlib set-up for every PNG sempar writes: the Agg backend and one save routine."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(fig, path: Path) -> Path:
    """Lay out, write at 110 dpi (creating the folder), close; returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
