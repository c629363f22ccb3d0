"""Placements solved from `RoutingStats` instead of a whole trace (`sempar place --stats`).

The `sempar` solver's `rows` objective (placement/sempar/rows.py) solves on a seeded sample of
whole fit requests (`stats.sample`, at most `SemparConfig.row_sample` rows) and
builds the placement's token table from the whole fit trace's token x expert counts. A
`RoutingStats` holds exactly that sample (part "sample", the same rule, merged exactly across
shards) and those counts (part "tokens"), so the solve here runs the same code on the same
inputs: the search settings are decided from the whole trace's size (`SemparConfig.for_shape`
with the stats' row count and `--effort`, the work budget's rows included: a smaller sample
is the same bottom-k rule's prefix, so it is drawn from the stats' sample exactly as from the
trace), the solve runs on the sample, and the token table is rebuilt from
the stats' counts with the co-clustering rule (`base.token_table_row`). Same seed, same
settings: the same placement as `solve("sempar", trace, objective="rows")` on the trace the
stats summarise (tested). What it cannot do, refused with one line: other methods and the
`tokens` objective (they read every fit row), and `--nodes` > 1 (the node grouping reads the
fit rows' co-activation across devices).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
from scipy import sparse

from sempar.stats.routing_stats import RoutingStats
from sempar.errors import InputError
from sempar.placement.base import PlacementProblem, token_table_row
from sempar.placement.placement import Placement
from sempar.placement.sempar.config import SemparConfig
from sempar.placement.sempar.rows import first_copy_device
from sempar.solve_options import SolveOptions
from sempar.predict.token_table import TokenTable


class TableCounts:
    """The part of `AffinityStats` that `base.token_table_row` reads, from the stats' per-layer
    token x expert counts (CSR [V, N]) and each token's occurrences occurrences int64[V]:
    `tokens` int64[U] the fit token ids (those seen), `U`, and `device_share`. Capped tables
    (`stats.sketch`) read each share low by at most (N / G) x error[l] / (k x occurrences);
    a token whose cells were all dropped at a layer gets device 0 with confidence 0."""

    def __init__(self, tables: list[sparse.csr_matrix], top_k: int,
                 occurrences: np.ndarray | None = None):
        self.tables, self.k = tables, top_k
        if occurrences is None:                                    # exact tables: k per occurrence
            occurrences = np.asarray(tables[0].sum(axis=1)).ravel() // top_k
        self.tokens = np.flatnonzero(occurrences).astype(np.int64)
        self.a = occurrences[self.tokens].astype(np.float64)
        self.N = tables[0].shape[1]

    @property
    def U(self) -> int:
        return int(self.tokens.size)

    def device_share(self, l: int, expert_device: np.ndarray, G: int) -> np.ndarray:
        """float64[U, G]: share of each token's activations at layer l on each device."""
        onehot = np.zeros((self.N, G))
        onehot[np.arange(self.N), np.asarray(expert_device, np.int64)] = 1.0
        share = np.asarray(self.tables[l][self.tokens].astype(np.float64) @ onehot)
        share /= (self.k * self.a)[:, None]
        return share


def check_stats_solve(stats: RoutingStats, method: str, options: SolveOptions) -> None:
    """One line when `place --stats` cannot give what `place --trace` would (module docstring)."""
    if method != "sempar":
        raise InputError(f"--stats: {method} reads every fit row; only the sempar solver's rows "
                         f"objective solves from statistics (use --trace)")
    if options.items(stats.meta.has_token_ids) != "rows":
        raise InputError(f"--stats: --objective {options.objective} with --homes "
                         f"{options.homes} solves on token ids over every fit row; statistics "
                         f"solve the rows objective (--objective rows)")
    if options.num_nodes > 1:
        raise InputError("--stats: --nodes > 1 groups devices by the fit rows' co-activation; "
                         "use --trace")
    stats.require("sample", "place --stats")
    if stats.seed != options.seed:
        raise InputError(f"--seed: {options.seed}, but the stats' sample was drawn with seed "
                         f"{stats.seed}; pass --seed {stats.seed} or rebuild the stats")
    want = SemparConfig().row_sample
    if stats.sample_rows != want:
        raise InputError(f"stats: the sample holds up to {stats.sample_rows} rows; the rows "
                         f"objective samples {want}: rebuild with --sample-rows {want}")


def solve_from_stats(stats: RoutingStats, *, num_devices: int,
                     options: SolveOptions | None = None, mapper: Callable | None = None,
                     **knobs) -> Placement:
    """`sempar`'s rows-objective placement from `stats` under `options` (with `knobs` set over
    them, as `base.solve` takes them; module docstring). `mapper` runs tp mode's per-layer
    solves (`_pool.map_layers`' signature; default: forked workers, `--jobs`;
    `sempar.ray_layers.RayLayers`: Ray tasks); the placement does not depend on it."""
    from sempar.placement.sempar._pool import map_layers
    from sempar.placement.sempar.solver import sempar_solve

    options = dataclasses.replace(options or SolveOptions(objective="rows"), **knobs)
    check_stats_solve(stats, "sempar", options)
    meta = stats.meta
    problem = PlacementProblem.of(stats.sample_trace(), num_devices, options)
    cfg = SemparConfig.for_shape(stats.rows, meta.num_layers, meta.num_experts, num_devices,
                                 options.effort)
    placement = sempar_solve(problem, cfg, mapper=mapper or map_layers)
    if meta.has_token_ids:
        if stats.tokens is None:
            placement.token_table = None
            placement.info["token_table_dropped"] = "the stats hold no token counts"
        else:
            counts = TableCounts(stats.tokens, meta.top_k, stats.token_occurrences)
            dev = first_copy_device(placement)
            rows = [token_table_row(counts, l, dev[l], num_devices)
                    for l in range(meta.num_layers)]
            placement.token_table = TokenTable(counts.tokens, np.stack([r[0] for r in rows]),
                                               np.stack([r[1] for r in rows]))
    placement.info["fit_stats"] = {"rows": stats.rows, "shards": len(stats.shards),
                                   "sample_rows": int(stats.sample["row"].size)}
    if stats.tokens is not None and stats.token_cells:
        placement.info["fit_stats"]["token_cells"] = int(stats.token_cells)
        placement.info["fit_stats"]["token_error_max"] = int(stats.token_error.max(initial=0))
    return placement
