"""The locality layouts of a stats FILE (`Source.home`): each expert's device among G, about
N / G experts a device, co-activated experts together. Registered by name in `LAYOUTS`
(`PluginConfig.layout`, `SEMPAR_EPLB_LAYOUT`):

- `sempar` (ours, issue 43; the default): sempar's own solver, the registered `sempar`
  placement's `rows` objective (`placement/sempar/rows.py`, `sempar place --stats`'s solve),
  on FILE's sample rows: local activations of whole rows under a per-layer balance cap on
  those rows' loads, each expert's device the one of its first copy. Work-bounded, not
  wall-clock-bounded (every rank must compute the same layout, `source.load_source`): one
  restart, no held-out calibration (the policy balances the live window itself),
  `layout_rows` rows at most, `layout_effort` x the solver's work budget; run in-process on one
  core (no forked workers inside an engine).
- `metis`: the METIS baseline of s-MoE §5.7 on the expert co-activation graph (pymetis
  `part_graph` on each expert's `NEIGHBOURS` strongest pairs, then
  `graph_baselines.fix_expert_counts`); the fallback of `sempar` where FILE has no sample rows
  or the solve fails.

Computed once per (FILE version, G, layout) and cached on the `Source` (`Source.home`), so its
cost is paid at the first rebalance after FILE changes, not at every one
(benchmarks/bench_eplb_plugin.py reports it apart).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sempar.registry import Registry

NEIGHBOURS = 16        # strongest co-activation pairs per expert kept in the METIS graph


@dataclass(frozen=True)
class LayoutSpec:
    """A locality layout: `needs_sample` (it reads FILE's rows, not only the pair counts), the
    one-line description lists and docs show."""

    needs_sample: bool
    description: str


LAYOUTS: Registry[LayoutSpec] = Registry("EPLB locality layout")
LAYOUTS.add("sempar", LayoutSpec(True, "ours: sempar's rows-objective solver on FILE's sample "
                                 "rows (falls back to metis without a sample)"))
LAYOUTS.add("metis", LayoutSpec(False, "METIS on the co-activation graph (s-MoE §5.7 baseline)"))


def partition(A: np.ndarray, G: int, seed: int = 0) -> np.ndarray:
    """int64[N]: part of each expert, ceil(N / G) at most per part, co-activated experts
    together: METIS on the expert graph A float[N, N] (edge weights scaled to integers), then
    the count fix-up of the METIS baseline (`capped`)."""
    import pymetis

    N = A.shape[0]
    cap = -(-N // G)
    if G == 1:
        return np.zeros(N, np.int64)
    top = float(A.max())
    W = np.rint(A / top * 1e4).astype(np.int64) if top > 0 else np.zeros_like(A, np.int64)
    np.fill_diagonal(W, 0)
    if N > NEIGHBOURS:              # each expert's strongest pairs only: METIS time ~ edges
        keep = np.zeros_like(W, bool)
        nb = np.argpartition(-W, NEIGHBOURS, axis=1)[:, :NEIGHBOURS]
        keep[np.arange(N)[:, None], nb] = True
        W = np.where(keep | keep.T, W, 0)
    rows, cols = np.nonzero(W)
    if rows.size == 0:                      # no co-activation at all: contiguous groups
        return np.arange(N, dtype=np.int64) // cap
    xadj = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=N))])
    _, part = pymetis.part_graph(G, pymetis.CSRAdjacency(xadj.astype(np.int64),
                                                         cols.astype(np.int64)),
                                 eweights=W[rows, cols], options=pymetis.Options(seed=seed))
    return capped(np.asarray(part, np.int64), A, G)


def capped(home: np.ndarray, A: np.ndarray, G: int) -> np.ndarray:
    """home int64[N] with at most ceil(N / G) experts per device: a placement solved with more
    redundant slots than the engine has may hold more primaries on a device than fit beside the
    engine's replicas; the extra ones move where they lose the least affinity A float[N, N]
    (`fix_expert_counts`)."""
    N = home.size
    cap = -(-N // G)
    if np.bincount(home, minlength=G).max() <= cap:
        return home
    from sempar.placement.graph_baselines import fix_expert_counts

    onehot = np.zeros((N, G))
    onehot[np.arange(N), home] = 1.0
    return fix_expert_counts(home, A @ onehot, cap)[0]


def metis_home(affinity: np.ndarray, G: int, seed: int = 0) -> np.ndarray:
    """int64[L, N]: `partition` of every layer's co-activation graph affinity float32[L, N, N]."""
    return np.stack([partition(affinity[l], G, seed) for l in range(affinity.shape[0])])


def sempar_home(meta, sample: np.ndarray, requests: np.ndarray | None, G: int, seed: int = 0,
                *, max_imbalance: float = 1.10, rows: int = 4096, effort: float = 1.0,
                affinity: np.ndarray | None = None,
                solver: Callable | None = None) -> np.ndarray:
    """int64[L, N]: the `sempar` layout (module docstring) of FILE's sample rows
    sample int[T, L, k] (requests int64[T]: each row's request, or None: each row its own)
    for the model `meta` (`TraceMeta`). The solver's placement gives each expert the device of
    its first copy (`first_copy_device`); `capped` keeps ceil(N / G) a device. Raises whatever
    the solver raises (the caller falls back to `metis`). `solver` (tests): replaces
    `sempar_solve`."""
    from sempar.placement.base import PlacementProblem
    from sempar.placement.sempar import SemparConfig, sempar_solve
    from sempar.placement.sempar.rows import first_copy_device
    from sempar.solve_options import SolveOptions
    from sempar.trace.schema import RoutingTrace

    T = sample.shape[0]
    if T == 0:
        raise ValueError("no sample rows")
    if rows and T > rows:                   # evenly spaced: the sample is in arrival order
        keep = np.linspace(0, T - 1, rows).astype(np.intp)
        sample = sample[keep]
        requests = None if requests is None else requests[keep]
        T = rows
    req = np.arange(T, dtype=np.int64) if requests is None else np.asarray(requests, np.int64)
    zeros = np.zeros(T, np.int64)
    trace = RoutingTrace(meta, zeros, req, zeros.copy(), np.asarray(sample, np.int64))
    problem = PlacementProblem.of(trace, G, SolveOptions(objective="rows", jobs=1, seed=seed,
                                                         max_imbalance=max_imbalance,
                                                         effort=effort))
    cfg = SemparConfig(row_restarts=1, held_out_folds=0, held_out_retries=0,
                       held_out_replicates=0)
    with warnings.catch_warnings():     # no bootstrap replicates: empty means, not errors
        warnings.simplefilter("ignore", RuntimeWarning)
        placement = (solver or sempar_solve)(problem, cfg)
    home = np.asarray(first_copy_device(placement), np.int64)
    L, N = meta.num_layers, meta.num_experts
    if home.shape != (L, N) or home.min() < 0 or home.max() >= G:
        raise ValueError(f"sempar's layout has shape {home.shape}, not ({L}, {N}) on {G} devices")
    if affinity is not None:
        home = np.stack([capped(home[l], affinity[l], G) for l in range(L)])
    return home


def layout_line(source, G: int, layout: str) -> str:
    """Which locality layout a `Source` gave for G devices (`Source.layouts`): "placement",
    the layout asked for, or "metis" with the reason `sempar` fell back (the log line's end)."""
    if source.base_home is not None:
        return "placement"
    used, _, why = source.layouts.get((G, layout), (layout, 0.0, None))
    return used if why is None else f"{used} (sempar fell back: {why})"
