"""Two-phase alpha-beta profiler over torch.distributed (CAMoE §3.3, Appendix A.1, Alg. 1).

Phase 1 (baseline): for every directed pair (u, v) and message size M, an isolated transfer
u -> v (only that pair active; the other ranks wait at a barrier) timed at u as a ping-pong:
M bytes out, 1 byte back, minus half the 1-byte round trip of that pair. A least-squares fit
t = alpha + beta * M per pair (residuals relative to t, so small and large sizes count alike)
gives (alpha0, beta0).

Phase 2 (congestion-aware): for every source u and size M, a one-to-many pattern (u sends M to
every other rank at once); the baseline predicts the bottleneck edge
v* = argmax_v alpha0[u,v] + beta0[u,v] * M and the pattern's time is a sample of that edge under
contention (dispatch). Combine uses the symmetric many-to-one pattern into u and its predicted
bottleneck v* -> u. Edges with samples at >= 2 sizes are refitted from them; the others (one
size cannot separate alpha from beta), and the metadata phase, keep the baseline (Alg. 1 l. 731).

Alg. 1 loops over phases m/d/c in phase 1 too; here the three phases move the same bytes over the
same link, so one isolated sweep serves all three. Unlike CAMoE ("no warm-ups or repeated
trials") we take the median of `reps` repeats: a shared 2-core machine is noisy.
Timing is local to the initiating rank, so it needs no clock shared between hosts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from sempar.comm.topology import PHASES, Topology

DEFAULT_SIZES = (4096, 65536, 262144, 786432)
DEFAULT_REPS = 3
SMALL_PINGS = 5
TAG_DATA, TAG_ACK, TAG_GO = 11, 12, 13


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float],
                   floor_alpha: float = 0.0) -> tuple[float, float]:
    """(alpha s, beta s/byte) of t = alpha + beta * M by least squares on the times.

    Plain (absolute) residuals: an all-to-all's time is set by its largest transfers, so those
    must be right. A negative intercept (htb lets a first burst through at line rate, which bends
    the small sizes down) falls back to alpha = `floor_alpha` (the measured 1-byte one-way
    latency) and beta refitted with that intercept. beta is kept > 0."""
    m = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if m.size == 0:
        raise ValueError("no samples to fit")
    if np.unique(m).size >= 2:
        A = np.stack([np.ones_like(m), m], axis=1)
        (alpha, beta), *_ = np.linalg.lstsq(A, t, rcond=None)
        if alpha >= 0 and beta > 0:
            return float(alpha), float(beta)
    alpha = max(float(floor_alpha), 0.0)
    beta = float(np.sum(m * (t - alpha)) / np.sum(m * m))
    return alpha, float(max(beta, 1e-15))


# ---- rank side --------------------------------------------------------------------------------
def _now() -> float:
    return time.perf_counter()


def profile_rank(rank: int, world: int, sizes: Sequence[int] = DEFAULT_SIZES,
                 reps: int = DEFAULT_REPS, phase2: bool = True) -> dict[str, Any] | None:
    """Run on every rank (launch entry); rank 0 returns `assemble`'s input, the others None."""
    import torch
    import torch.distributed as dist

    sizes = sorted(int(s) for s in sizes)
    big = max(sizes)
    buf = torch.zeros(big, dtype=torch.uint8)
    rbufs = torch.zeros((world, big), dtype=torch.uint8)
    one = torch.zeros(1, dtype=torch.uint8)
    ones = torch.zeros((world, 1), dtype=torch.uint8)
    p1: list[list[float]] = []         # [u, v, M, t]
    rtt1: list[list[float]] = []       # [u, v, rtt]
    p2: list[list[Any]] = []           # [kind "d"|"c", u, M, t]
    t_start = _now()

    def pingpong(u: int, v: int, m: int) -> float | None:
        if rank == u:
            t0 = _now()
            dist.send(buf[:m], v, tag=TAG_DATA)
            dist.recv(one, v, tag=TAG_ACK)
            return _now() - t0
        if rank == v:
            dist.recv(rbufs[u, :m], u, tag=TAG_DATA)
            dist.send(one, u, tag=TAG_ACK)
        return None

    half_rtt = np.zeros(world)
    for u in range(world):                                  # phase 1: isolated pairs
        for v in range(world):
            if u == v:
                continue
            dist.barrier()
            if rank not in (u, v):
                continue
            pingpong(u, v, 1)                               # connection warm-up
            small = [pingpong(u, v, 1) for _ in range(SMALL_PINGS)]
            if rank == u:
                r = float(np.median(small))
                rtt1.append([u, v, r])
                half_rtt[v] = r / 2
            for m in sizes:
                ts = [pingpong(u, v, m) for _ in range(reps)]
                if rank == u:
                    p1.append([u, v, m, max(float(np.median(ts)) - half_rtt[v], 1e-7)])
    if phase2:
        mean_half = float(half_rtt.sum() / max(world - 1, 1))
        for u in range(world):
            for m in sizes:
                for kind in ("d", "c"):
                    ts = []
                    for _ in range(reps):
                        dist.barrier()
                        t = _one_to_many(dist, rank, world, u, m, kind, buf, rbufs, one, ones)
                        if t is not None:
                            ts.append(t - mean_half)
                    if rank == u:
                        p2.append([kind, u, m, max(float(np.median(ts)), 1e-7)])
    dist.barrier()
    mine = {"p1": p1, "rtt1": rtt1, "p2": p2}
    every: list[Any] = [None] * world
    dist.all_gather_object(every, mine)
    if rank != 0:
        return None
    return {"world": world, "sizes": sizes, "reps": reps, "seconds": _now() - t_start,
            "p1": [x for e in every for x in e["p1"]], "rtt1": [x for e in every for x in e["rtt1"]],
            "p2": [x for e in every for x in e["p2"]]}


def _one_to_many(dist, rank: int, world: int, u: int, m: int, kind: str, buf, rbufs, one,
                 ones) -> float | None:
    """kind "d": u sends m bytes to every other rank at once, each acks 1 byte; "c": u sends a
    1-byte go to every other rank, each answers m bytes. Returns u's elapsed time, else None."""
    others = [v for v in range(world) if v != u]
    if rank == u:
        t0 = _now()
        if kind == "d":
            works = [dist.isend(buf[:m], v, tag=TAG_DATA) for v in others]
            works += [dist.irecv(ones[v], v, tag=TAG_ACK) for v in others]
        else:
            works = [dist.isend(one, v, tag=TAG_GO) for v in others]
            works += [dist.irecv(rbufs[v, :m], v, tag=TAG_DATA) for v in others]
        for w in works:
            w.wait()
        return _now() - t0
    if kind == "d":
        dist.recv(rbufs[u, :m], u, tag=TAG_DATA)
        dist.send(one, u, tag=TAG_ACK)
    else:
        dist.recv(ones[u], u, tag=TAG_GO)
        dist.send(buf[:m], u, tag=TAG_DATA)
    return None


# ---- assembling the topology -----------------------------------------------------------------
def assemble(raw: dict[str, Any], name: str = "profiled",
             node_of: Sequence[int] | None = None) -> tuple[Topology, dict[str, Any]]:
    """Topology (alpha, beta per phase) from `profile_rank`'s samples, and a summary:
    baseline alpha0/beta0, bottleneck edges refined in phase 2, sample counts."""
    G = int(raw["world"])
    a0, b0 = np.zeros((G, G)), np.zeros((G, G))
    lat = {(int(u), int(v)): r / 2 for u, v, r in raw.get("rtt1", [])}   # 1-byte one-way
    for u in range(G):
        for v in range(G):
            if u == v:
                continue
            pts = [(m, t) for (uu, vv, m, t) in raw["p1"] if (uu, vv) == (u, v)]
            if not pts:
                raise ValueError(f"profile: no phase-1 samples for pair {u} -> {v}")
            a0[u, v], b0[u, v] = fit_alpha_beta(*zip(*pts), floor_alpha=lat.get((u, v), 0.0))
    alpha = np.repeat(a0[None], len(PHASES), axis=0)
    beta = np.repeat(b0[None], len(PHASES), axis=0)
    pd = PHASES.index("dispatch")
    pc = PHASES.index("combine")
    edge_pts: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for kind, u, m, t in raw.get("p2", []):
        cand = [v for v in range(G) if v != u]
        if kind == "d":       # bottleneck of u -> all: argmax_v alpha0[u,v] + beta0[u,v] * M
            v = max(cand, key=lambda v: a0[u, v] + b0[u, v] * m)
            edge_pts.setdefault(("d", u, v), []).append((m, t))
        else:                 # symmetric choice for combine: argmax_v alpha0[v,u] + beta0[v,u] * M
            v = max(cand, key=lambda v: a0[v, u] + b0[v, u] * m)
            edge_pts.setdefault(("c", v, u), []).append((m, t))
    refined = []
    for (kind, u, v), pts in sorted(edge_pts.items()):
        p = pd if kind == "d" else pc
        ms = [m for m, _ in pts]
        if len(set(ms)) < 2:      # one size cannot separate alpha from beta: keep the baseline
            continue
        alpha[p, u, v], beta[p, u, v] = fit_alpha_beta(*zip(*pts), floor_alpha=lat.get((u, v), 0.0))
        refined.append({"phase": PHASES[p], "src": u, "dst": v, "samples": len(pts),
                        "baseline_bw_Bps": 1 / b0[u, v], "refined_bw_Bps": 1 / beta[p, u, v]})
    node = np.zeros(G, np.int32) if node_of is None else np.asarray(node_of, np.int32)
    topo = Topology(name, node, alpha, beta)
    summary = {"hosts": G, "sizes": raw["sizes"], "reps": raw["reps"],
               "seconds": round(float(raw["seconds"]), 3),
               "baseline": {"alpha": a0.tolist(), "beta": b0.tolist()},
               "refined_edges": refined, "phase1_samples": len(raw["p1"]),
               "phase2_samples": len(raw.get("p2", []))}
    return topo, summary


def bandwidth_matrix(topo: Topology, phase: str = "dispatch") -> np.ndarray:
    """float64[G, G]: bytes/s = 1 / beta (diagonal 0)."""
    b = topo.beta[PHASES.index(phase)]
    with np.errstate(divide="ignore"):
        bw = np.where(b > 0, 1.0 / np.where(b > 0, b, 1.0), 0.0)
    np.fill_diagonal(bw, 0.0)
    return bw
