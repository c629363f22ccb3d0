"""Independent per-layer work run in forked worker processes, results in layer order.

`map_layers(fn, L, jobs, block)` returns [fn(0), ..., fn(L - 1)]. With `jobs` > 1 on a
platform that can fork, the layers go to `jobs` worker processes forked from this one, so the
workers see the caller's arrays (the trace, its statistics) without copying or pickling them:
only the layer index goes out and fn's result (plain numpy arrays and numbers) comes back.
Each worker takes `block` consecutive layers at a time (the affinity statistics gather the
trace's selections `affinity_stats.BLOCK_LAYERS` layers at once), fewer when there are too few
layers to give every worker a block. With `jobs` <= 1, one layer, no fork (not Linux/macOS)
or inside another map, fn runs here, in order: the serial run. A worker that dies (killed, out
of memory) raises `concurrent.futures.process.BrokenProcessPool` here rather than leaving the
map waiting.

Every call of fn runs with one BLAS thread (threadpoolctl), in the workers and in the serial
run alike: the layers are the parallelism, and BLAS's own threads would compete with them for
the same cores (spinning OpenBLAS threads slow small products such as the large-trace path's
Gram matrices by an order of magnitude on a loaded machine).

fn must not depend on what an earlier call left behind (a cache is fine: it only saves work),
so the results are the same whichever process computes which layer; what fn changes in its
own process is not seen by the caller when it runs in a worker.

`usable_cpus()`: the CPUs this process may run on (`os.sched_getaffinity`), the default
number of workers.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, TypeVar

from threadpoolctl import threadpool_limits

T = TypeVar("T")

_TASK: Callable | None = None       # what the forked workers run (set before forking)


def usable_cpus() -> int:
    """The number of CPUs this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                       # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


def _run(l: int):
    return _TASK(l)


def map_layers(fn: Callable[[int], T], num_layers: int, jobs: int, block: int = 1) -> list[T]:
    """[fn(l) for l in range(num_layers)], on up to `jobs` forked workers (module docstring)."""
    global _TASK
    jobs = min(int(jobs), num_layers)
    with threadpool_limits(1):      # set here, before forking: the workers inherit it
        if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods() \
                or _TASK is not None:            # (already inside a map: no nested pools)
            return [fn(l) for l in range(num_layers)]
        _TASK = fn
        try:
            # an executor, not multiprocessing.Pool: a worker that dies raises
            # BrokenProcessPool here instead of leaving map waiting for its layers forever
            with ProcessPoolExecutor(jobs, multiprocessing.get_context("fork")) as pool:
                chunk = max(1, min(block, -(-num_layers // jobs)))  # every worker gets some
                return list(pool.map(_run, range(num_layers), chunksize=chunk))
        finally:
            _TASK = None
