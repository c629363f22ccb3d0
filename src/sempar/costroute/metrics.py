"""Figures of the lambda sweep (CAMoE §4.4-4.5): routing shift (Table 2), load, Pareto point.

See `sempar.costroute.sweep` for the protocol and the definitions these functions implement.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sempar.placement.metrics import peak_ratio

KL_EPS = 1e-10


def cv(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    m = x.mean()
    return float(x.std() / m) if m > 0 else 0.0


def kl(p_counts: np.ndarray, q_counts: np.ndarray, eps: float = KL_EPS) -> float:
    """KL(p || q) in nats of two count vectors (normalised; eps added to both, renormalised)."""
    p = np.asarray(p_counts, np.float64)
    q = np.asarray(q_counts, np.float64)
    p = p / p.sum() + eps
    q = q / q.sum() + eps
    p, q = p / p.sum(), q / q.sum()
    return float(max(0.0, np.sum(p * np.log(p / q))))


def routing_shift(counts: np.ndarray, base: np.ndarray) -> dict[str, float]:
    """CAMoE Table 2 figures from counts int[L, E] against the lambda = 0 counts."""
    return {"cv": cv(counts.sum(axis=0)),
            "avg_layer_cv": float(np.mean([cv(c) for c in counts])),
            "kl": kl(counts.sum(axis=0), base.sum(axis=0)),
            "avg_layer_kl": float(np.mean([kl(c, b) for c, b in zip(counts, base)]))}


def device_imbalance(counts: np.ndarray, hosts: np.ndarray) -> float:
    """Mean over layers of max / mean device activations (replicas share an expert's load)."""
    share = hosts / hosts.sum(axis=1, keepdims=True)                    # [L, G, E]
    load = np.einsum("lge,le->lg", share, counts.astype(np.float64))
    return float(peak_ratio(load).mean())


def pareto(points: list[dict], max_acc_loss: float) -> dict[str, Any]:
    """The Pareto point and front (see module docstring) of the sweep's points."""
    front = []
    for p in points:
        dominated = any(q["a2a_mean_s"] <= p["a2a_mean_s"] and q["acc_mean"] >= p["acc_mean"]
                        and (q["a2a_mean_s"] < p["a2a_mean_s"] or q["acc_mean"] > p["acc_mean"])
                        for q in points)
        if not dominated:
            front.append(p["lambda"])
    ok = [p for p in points if -p["acc_change_points"] <= max_acc_loss]
    best = min(ok, key=lambda p: (p["a2a_mean_s"], p["lambda"])) if ok else points[0]
    return {"lambda": best["lambda"], "a2a_mean_change": best["a2a_mean_change"],
            "a2a_p95_change": best["a2a_p95_change"], "acc_change_points": best["acc_change_points"],
            "ppl_change": best["ppl_change"], "max_acc_loss": max_acc_loss,
            "rule": f"largest mean all-to-all cut with mean accuracy loss <= {max_acc_loss} points",
            "front": front}


def finish(points: list[dict], max_acc_loss: float) -> dict[str, Any]:
    """Add the changes against lambda = 0 (the first point) and the Pareto point."""
    b = points[0]
    for p in points:
        p["a2a_mean_change"] = p["a2a_mean_s"] / b["a2a_mean_s"] - 1 if b["a2a_mean_s"] else 0.0
        p["a2a_p95_change"] = p["a2a_p95_s"] / b["a2a_p95_s"] - 1 if b["a2a_p95_s"] else 0.0
        p["acc_change_points"] = 100 * (p["acc_mean"] - b["acc_mean"])
        p["ppl_change"] = p["ppl_mean"] / b["ppl_mean"] - 1
        for lp, lb in zip(p["layers"], b["layers"]):
            lp["a2a_mean_change"] = lp["a2a_mean_s"] / lb["a2a_mean_s"] - 1 if lb["a2a_mean_s"] else 0.0
            lp["a2a_p95_change"] = lp["a2a_p95_s"] / lb["a2a_p95_s"] - 1 if lb["a2a_p95_s"] else 0.0
    return pareto(points, max_acc_loss)
