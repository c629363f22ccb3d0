"""A Ray session for sempar's distributed work (`stats build --ray`, `place --stats --ray`).

`ray_session(address, cpus)` joins or starts a cluster for the block and leaves it as it found
it: "local" (or None) starts a local cluster with `cpus` CPUs, shut down afterwards; "auto"
joins the cluster `ray start` made; anything else is a cluster address. The driver's
PYTHONPATH goes to the workers (`runtime_env`), so a checkout's sempar runs there too (the
workers need the same sempar and, for shard builds, the shard paths). Ray is the optional
`ray` extra: without it the session is one line of bad input. When Ray is already initialised
(a test's cluster, a caller's session) it is used as it is and left running.

`ray_task_error(err)`: the `InputError` a task raised, when it raised one (Ray wraps task
exceptions), so a bad shard on a worker is still one line here.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

from sempar.errors import InputError


def import_ray() -> Any:
    """The `ray` module, or one line of bad input when it is not installed."""
    try:
        import ray
    except ImportError:
        raise InputError("--ray: Ray is not installed (pip install 'sempar[ray]')") from None
    return ray


@contextmanager
def ray_session(address: str | None, cpus: int) -> Iterator[Any]:
    """The `ray` module with a session open for the block (module docstring)."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        kw = {"num_cpus": max(1, cpus)} if address in (None, "local") else {"address": address}
        ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 runtime_env={"env_vars": {k: os.environ[k] for k in ("PYTHONPATH",)
                                           if k in os.environ}}, **kw)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def ray_task_error(err: BaseException) -> InputError | None:
    """The InputError behind a `ray.exceptions.RayTaskError`, if that is what the task raised."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, InputError) else None
