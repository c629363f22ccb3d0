"""Fidelity of a profiled topology: all-to-all time predicted by CAMoE eq. 9
(`Topology.a2a_seconds("dispatch", bytes)`) against the time measured on the ranks.

Cases: per-pair byte matrices int64[G, G] (diagonal 0: local data never crosses a link), for
each message size S: `uniform` (S on every pair), `skewed` (lognormal weights, sigma 1, rescaled to
a mean of S per pair) and `hot` (every rank sends 3 S to one destination and S / 2 to the others).
Measured: `all_to_all_single` with those splits (gloo), timed on every rank after a barrier; a
repeat's time is the slowest rank's, a case's the median over repeats. Error = |predicted -
measured| / measured; the figure is the median over cases (CAMoE Fig. 6 plots the fit).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sempar.comm.topology import Topology

DEFAULT_CASE_SIZES = (65536, 262144, 655360)
KINDS = ("uniform", "skewed", "hot")
DEFAULT_REPS = 3


def fidelity_cases(hosts: int, sizes: Sequence[int] = DEFAULT_CASE_SIZES,
                   kinds: Sequence[str] = KINDS, seed: int = 0) -> list[dict[str, Any]]:
    """[{"name", "kind", "size", "bytes": int64[G][G] as lists}] (see module doc)."""
    rng = np.random.default_rng(seed)
    G = hosts
    off = ~np.eye(G, dtype=bool)
    cases = []
    for i, s in enumerate(sizes):
        for kind in kinds:
            if kind == "uniform":
                b = np.full((G, G), float(s))
            elif kind == "skewed":
                w = rng.lognormal(0.0, 1.0, size=(G, G))
                b = w / w[off].mean() * s
            elif kind == "hot":
                b = np.full((G, G), s / 2)
                hot = i % G
                b[:, hot] = 3 * s
            else:
                raise ValueError(f"unknown fidelity case kind {kind!r}")
            b = np.where(off, np.maximum(np.round(b), 1), 0).astype(np.int64)
            cases.append({"name": f"{kind}-{s // 1024}KiB", "kind": kind, "size": int(s),
                          "bytes": b.tolist()})
    return cases


METHODS = ("all_to_all_single", "p2p")


def a2a_rank(rank: int, world: int, cases: list[list[list[int]]], reps: int = DEFAULT_REPS,
             method: str = "p2p") -> list[float] | None:
    """Launch entry: measure every case's all-to-all; rank 0 returns seconds per case.

    method: `p2p` (every isend / irecv posted at once, the concurrency eq. 9 assumes) or
    `all_to_all_single` (gloo's alltoallv, which on this testbed runs partly serialised)."""
    import torch
    import torch.distributed as dist

    def once(b: np.ndarray) -> float:
        send = [int(x) for x in b[rank]]
        recv = [int(x) for x in b[:, rank]]
        inp = torch.zeros(sum(send), dtype=torch.uint8)
        out = torch.empty(sum(recv), dtype=torch.uint8)
        dist.barrier()
        t0 = time.perf_counter()
        if method == "p2p":
            so, ro = np.cumsum([0] + send), np.cumsum([0] + recv)
            works = [dist.irecv(out[ro[v]:ro[v + 1]], v) for v in range(world)
                     if v != rank and recv[v] > 0]
            works += [dist.isend(inp[so[v]:so[v + 1]], v) for v in range(world)
                      if v != rank and send[v] > 0]
            for w in works:
                w.wait()
        else:
            dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    mats = [np.asarray(c, dtype=np.int64) for c in cases]
    warm = np.where(np.eye(world, dtype=bool), 0, 1024)
    once(warm)                                       # connections and buffers
    measured = [float(np.median([once(b) for _ in range(reps)])) for b in mats]
    return measured if rank == 0 else None


def fidelity_report(topo: Topology, cases: list[dict[str, Any]],
                    measured: Sequence[float], phase: str = "dispatch") -> dict[str, Any]:
    """{"median_abs_error", "num_cases", "cases": [{name, kind, size, predicted_s, measured_s,
    rel_error}], "by_kind": {kind: median error}}."""
    rows = []
    for c, m in zip(cases, measured, strict=True):
        pred = float(topo.a2a_seconds(phase, np.asarray(c["bytes"], dtype=np.float64)))
        rows.append({"name": c["name"], "kind": c["kind"], "size": c["size"],
                     "predicted_s": pred, "measured_s": float(m),
                     "rel_error": abs(pred - m) / m if m > 0 else float("inf")})
    errs = [r["rel_error"] for r in rows]
    by_kind = {k: float(np.median([r["rel_error"] for r in rows if r["kind"] == k]))
               for k in dict.fromkeys(r["kind"] for r in rows)}
    return {"median_abs_error": float(np.median(errs)) if errs else float("nan"),
            "num_cases": len(rows), "cases": rows, "by_kind": by_kind, "phase": phase}


def gloo_collectives(topo: Topology, cases: list[dict[str, Any]],
                     measured: Sequence[float]) -> dict[str, Any]:
    """The topology's `collectives` entry from gloo all-to-all cases: the fitted
    a2a_serialisation (comm.collective_models.fit_sigma) and the median |error| of eq. 9 and of
    the fitted model over the same cases."""
    from sempar.comm.collective_models import fit_sigma, serialised_a2a

    mats = [np.asarray(c["bytes"], dtype=np.float64) for c in cases]
    m = np.asarray(measured, np.float64)
    sigma = fit_sigma(topo, mats, list(m))
    err = lambda s: float(np.median([abs(serialised_a2a(topo, "dispatch", b, s) - t) / t  # noqa: E731
                                     for b, t in zip(mats, m)]))
    return {"model": "gloo", "a2a_serialisation": sigma, "cases": len(mats),
            "median_abs_error_eq9": err(0.0), "median_abs_error": err(sigma)}


def plot_fidelity(report: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Predicted against measured all-to-all time, one marker per case, y = x and +-15 %."""
    from sempar.report.figures import plt, save_figure

    fig, ax = plt.subplots(figsize=(5, 4.6))
    rows = report["cases"]
    meas = np.array([r["measured_s"] for r in rows]) * 1e3
    pred = np.array([r["predicted_s"] for r in rows]) * 1e3
    lo, hi = min(meas.min(), pred.min()) * 0.8, max(meas.max(), pred.max()) * 1.25
    xs = np.geomspace(lo, hi, 50)
    ax.fill_between(xs, xs * 0.85, xs * 1.15, color="0.88", zorder=0, label="+-15 %")
    ax.plot(xs, xs, "k-", lw=1, label="y = x")
    kinds = np.array([r["kind"] for r in rows])
    for kind, marker in zip(("uniform", "skewed", "hot"), "osD"):
        sel = kinds == kind
        if sel.any():
            ax.scatter(meas[sel], pred[sel], marker=marker, label=kind, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured all-to-all time (ms)")
    ax.set_ylabel("predicted, CAMoE eq. 9 (ms)")
    ax.set_title(title or f"median |error| {report['median_abs_error'] * 100:.1f} % over "
                 f"{report['num_cases']} cases", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, Path(path))


def profile_and_a2a_rank(rank: int, world: int, profile: dict[str, Any],
                         cases: list[list[list[int]]], reps: int = DEFAULT_REPS,
                         method: str = "p2p") -> dict[str, Any] | None:
    """Launch entry: the two-phase profile, then the all-to-all cases, in one start-up."""
    from sempar.testbed.profiler import profile_rank

    raw = profile_rank(rank, world, **profile)
    measured = a2a_rank(rank, world, cases, reps=reps, method=method) if cases else []
    return {"profile": raw, "a2a": measured} if rank == 0 else None
