"""tp mode's per-layer solves as Ray tasks (`place --stats --ray`): `_pool.map_layers`'s
signature on a Ray cluster.

`RayLayers(address, jobs)` is a mapper for `sempar_solve(..., mapper=)`: called with
(fn, L, jobs, block) it puts fn (the layer solve with the problem it reads: the row sample,
its settings) in the object store once and runs fn(l) as one Ray task per layer, results in
layer order. A call with one layer, or one made inside a task (the `rows` objective's layer
solve calls the mapper again for its one-layer problem), runs here, serially, through
`map_layers` with one job: no nested tasks. Each task runs with one BLAS thread, as
`map_layers`' workers do. Every layer's result depends on the seed only (`_pool`'s contract),
so the placement is the local one, bit for bit (tested on a local cluster).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from sempar.placement.sempar._pool import map_layers

T = TypeVar("T")

_IN_TASK = False       # set in a task's process: a nested call runs serially


def _layer(fn: Callable[[int], Any], l: int) -> Any:
    global _IN_TASK
    from threadpoolctl import threadpool_limits

    _IN_TASK = True
    try:
        with threadpool_limits(1):
            return fn(l)
    finally:
        _IN_TASK = False


class RayLayers:
    """A `map_layers`-shaped mapper running the layers as Ray tasks (module docstring); the
    caller holds the Ray session (`sempar.ray_cluster.ray_session`)."""

    def __init__(self, ray: Any):
        self.ray = ray
        self.tasks = 0           # layer tasks submitted (tests read it)

    def __call__(self, fn: Callable[[int], T], num_layers: int, jobs: int, block: int = 1
                 ) -> list[T]:
        if num_layers <= 1 or _IN_TASK:
            return map_layers(fn, num_layers, 1, block)
        ray = self.ray
        task = ray.remote(num_cpus=1)(_layer)
        ref = ray.put(fn)
        refs = [task.remote(ref, l) for l in range(num_layers)]
        self.tasks += num_layers
        return ray.get(refs)
