"""A Ray session for sempar's distributed work (`stats build --ray`, `place --stats --ray`).

`ray_session(address, cpus)` joins or starts a cluster for the block and leaves it as it found
it: "local" (or None) starts a local cluster with `cpus` CPUs, shut down afterwards; "auto"
joins the cluster `ray start` made; anything else is a cluster address. The driver's
PYTHONPATH goes to the workers (`runtime_env`), so a checkout's sempar runs there too (the
workers need the same sempar and, for shard builds, the shard paths). Ray is the optional
`ray` extra: without it the session is one line of bad input. When Ray is already initialised
(a test's cluster, a caller's session) it is used as it is and left running.

`check_address(value)` checks the address's form first (local, auto, HOST:PORT or
ray://HOST:PORT; one line naming it, control characters escaped), and joining a cluster is
bounded: the address must accept a TCP connection within `timeout` seconds (30 by default,
`--ray-timeout`), Ray's own GCS waits are set to the same bound (unless the user set them), and
whatever `ray.init` raises is one line.

`ray_task_error(err)`: the `InputError` a task raised, when it raised one (Ray wraps task
exceptions), so a bad shard on a worker is still one line here.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
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


CONNECT_TIMEOUT = 30.0      # seconds to reach a cluster's address (`--ray-timeout`)
_HOST = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                   r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of HOST:PORT, [IPv6]:PORT or ray://HOST:PORT; None when not of that form."""
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
        return host[1:-1], int(port)
    return (host, int(port)) if _HOST.fullmatch(host) else None


def check_address(value: str | None, option: str = "--ray") -> str | None:
    """`value` when it is local, auto or a cluster address (module docstring), else one line."""
    if value is None or value in ("local", "auto"):
        return value
    if len(value) > 300 or _host_port(value) is None:
        shown = ascii(value[:80] + ("..." if len(value) > 80 else ""))
        raise InputError(f"{option}: {shown} is not local, auto or a cluster address HOST:PORT")
    return value


def _reachable(address: str, timeout: float) -> None:
    """One line unless `address` accepts a TCP connection within `timeout` seconds."""
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        why = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise InputError(f"--ray: cannot reach a Ray cluster at {address} within "
                         f"{timeout:g} s ({why})") from None


@contextmanager
def ray_session(address: str | None, cpus: int, timeout: float = CONNECT_TIMEOUT) -> Iterator[Any]:
    """The `ray` module with a session open for the block (module docstring)."""
    ray = import_ray()
    address = check_address(address)
    started = not ray.is_initialized()
    if started:
        local = address in (None, "local")
        if address == "auto" and os.environ.get("RAY_ADDRESS"):   # where "auto" leads
            _reachable(check_address(os.environ["RAY_ADDRESS"], "RAY_ADDRESS"), timeout)
        elif not local and address != "auto":
            _reachable(address, timeout)
        knobs = {k: os.environ.get(k) for k in ("RAY_gcs_server_request_timeout_seconds",
                                                 "RAY_gcs_rpc_server_reconnect_timeout_s")}
        for k, v in knobs.items():          # Ray's own GCS waits bounded too (the user's kept)
            os.environ[k] = v or str(max(1, int(timeout)))
        kw = {"num_cpus": max(1, cpus)} if local else {"address": address}
        try:
            ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                     runtime_env={"env_vars": {k: os.environ[k] for k in ("PYTHONPATH",)
                                               if k in os.environ}}, **kw)
        except Exception as err:        # Ray raises ConnectionError, ValueError, RuntimeError...
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise InputError(f"--ray: cannot join the Ray cluster at {address or 'local'} "
                             f"({ascii(first)[1:-1]})") from None
        finally:
            for k, v in knobs.items():
                if v is None:
                    os.environ.pop(k, None)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def ray_task_error(err: BaseException) -> InputError | None:
    """The InputError behind a `ray.exceptions.RayTaskError`, if that is what the task raised."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, InputError) else None
