"""Where `RoutingStats` are built: shard by shard, here or as Ray tasks, merged in shard order.

`build_shard(path, settings)` streams one trace file (`trace.io.iter_blocks`, a row group at a
time) through a `StatsBuilder`; `build_stats(paths, settings, runner)` builds every shard and
folds the results into one with `routing_stats.merge` in the order the paths were given, so the result
is the stats of the shards' concatenation. Runners (`RUNNERS`, by name):

- `local` (the default; no Ray needed): `jobs` processes of this machine
  (`concurrent.futures`, forked), at most `jobs` shards in flight;
- `ray`: one Ray task per shard on the cluster `ray_address` names ("local": a local cluster
  started for this run with `jobs` CPUs; "auto": the running cluster `ray start` made;
  an address: that cluster). Workers must reach the shard paths (a shared filesystem) and run
  the same sempar. Ray is the optional `ray` extra.

In both, finished shards are merged as soon as their turn comes and then dropped, so memory
holds the running merge and the shards in flight, not every shard's stats. The local workers
hand their token tables over as files (`stats.spill`), read one layer at a time by the merge,
so the main process never holds a whole shard's tables (nor their pickle).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from sempar.stats.routing_stats import DEFAULT_PARTS, SAMPLE_ROWS, RoutingStats, merge, resolve_parts
from sempar.stats.build import StatsBuilder
from sempar.stats.sketch import TOKEN_CELLS
from sempar.errors import InputError
from sempar.registry import Registry


@dataclass(frozen=True, kw_only=True)
class StatsSettings:
    """What a shard's stats hold: parts (`routing_stats.PARTS`), the sample's seed and row
    budget, and the token tables' cap in cells a layer (`stats.sketch`; 0: exact, no cap)."""

    parts: tuple[str, ...] = DEFAULT_PARTS
    seed: int = 0
    sample_rows: int = SAMPLE_ROWS
    token_cells: int = TOKEN_CELLS


@contextmanager
def small_pages() -> Iterator[None]:
    """numpy's MADV_HUGEPAGE advice on its large allocations off for the block (restored).

    Why: the build allocates and drops many short-lived arrays of tens of MB (a chunk's sorted
    ids, the merged tables); with transparent huge pages on `madvise`, a first touch of an
    advised region may compact memory to build 2 MB pages. Merging two 255k-row DeepSeek-V3
    shards took 2.3 s of kernel time with the advice and 0.5 s without, saving the merged
    stats 3.7 s and 1.4 s (the same reason as `trace.io._small_pages`)."""
    import numpy as np

    setter = getattr(getattr(np, "_core", None), "multiarray", None)
    setter = getattr(setter, "_set_madvise_hugepage", None)
    if setter is None:
        yield
        return
    before = setter(False)
    try:
        yield
    finally:
        setter(before)


def build_shard(path: str, settings: StatsSettings) -> RoutingStats:
    """The stats of one trace file (module docstring)."""
    with small_pages():
        return _build_shard(path, settings)


def _build_shard(path: str, settings: StatsSettings) -> RoutingStats:
    from sempar.trace.io import iter_blocks

    builder = None
    for meta, domains, _row0, arrays in iter_blocks(path, optional=("domain",)):
        if builder is None:
            builder = StatsBuilder(meta, domains, resolve_parts(settings.parts, meta),
                                   settings.seed, settings.sample_rows, os.path.basename(path),
                                   token_cells=settings.token_cells)
        builder.add(arrays)
    return builder.finish()


def build_shard_spilled(path: str, settings: StatsSettings, folder: str, i: int
                        ) -> RoutingStats:
    """`build_shard`, its token tables written to a file in `folder` (`stats.spill`): what a
    local worker returns through the process pool instead of the tables themselves."""
    from sempar.stats.spill import spill_tables

    stats = build_shard(path, settings)
    if stats.tokens is not None:
        stats.tokens = spill_tables(stats.tokens, os.path.join(folder, f"shard{i}.tokens"))
    return stats


def _local(paths: list[str], settings: StatsSettings, jobs: int, address: str | None,
           timeout: float) -> Iterator[RoutingStats]:
    if jobs <= 1 or len(paths) == 1:
        for p in paths:
            yield build_shard(p, settings)
        return
    import multiprocessing
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="sempar-stats-") as folder, \
            ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = [pool.submit(build_shard_spilled, p, settings, folder, i)
                   for i, p in enumerate(paths[:jobs])]
        for i in range(len(paths)):
            res = futures[i].result()
            if i + jobs < len(paths):
                futures.append(pool.submit(build_shard_spilled, paths[i + jobs], settings,
                                           folder, i + jobs))
            futures[i] = None
            yield res


def _ray(paths: list[str], settings: StatsSettings, jobs: int, address: str | None,
         timeout: float) -> Iterator[RoutingStats]:
    from sempar.ray_cluster import ray_session, ray_task_error

    with ray_session(address, jobs, timeout) as ray:
        try:
            task = ray.remote(num_cpus=1)(build_shard)
            refs = [task.remote(p, settings) for p in paths[:jobs]]
            for i in range(len(paths)):
                res = ray.get(refs[i])
                if i + jobs < len(paths):
                    refs.append(task.remote(paths[i + jobs], settings))
                refs[i] = None
                yield res
        except ray.exceptions.RayTaskError as err:
            cause = ray_task_error(err)
            if cause is not None:
                raise cause from None
            raise


RUNNERS: Registry[Callable] = Registry("stats runner")
RUNNERS.add("local", _local)
RUNNERS.add("ray", _ray)


def check_shards(paths: list) -> None:
    """One line, before any work, when a shard is unreadable or of another model than the
    first (`TraceMeta.model_difference`: name, type or shape)."""
    from sempar.trace.io import read_header

    first = None
    for p in paths:
        meta = read_header(p)[2]
        if first is None:
            first = (p, meta)
            continue
        diff = first[1].model_difference(meta)
        if diff:
            raise InputError(f"{p}: another model than {first[0]} ({diff}: "
                             f"{getattr(meta, diff)!r} vs {getattr(first[1], diff)!r}); "
                             f"shards of one trace only")


def build_stats(paths: list[str], settings: StatsSettings, *, runner: str = "local",
                jobs: int = 1, ray_address: str | None = None,
                progress: Callable[[int], None] | None = None,
                ray_timeout: float = 30.0) -> RoutingStats:
    """The stats of the concatenation of the trace files `paths`, in order (module docstring).
    `progress(1)` is called as each shard is merged; `ray_timeout`: seconds to reach the
    cluster at `ray_address` (`ray_cluster.ray_session`)."""
    run = RUNNERS.get(runner)
    check_shards(paths)
    out = None
    with small_pages():
        for i, stats in enumerate(run(list(map(str, paths)), settings, max(1, jobs),
                                      ray_address, ray_timeout)):
            if out is None:                # the running merge's tables are held in memory
                out = stats
                if out.tokens is not None and not isinstance(out.tokens, list):
                    out.tokens = list(out.tokens)
            else:                          # a spilled shard's tables read a layer at a time
                out = merge(out, stats, str(paths[i]), consume=True)
            del stats
            if progress:
                progress(1)
    return out
