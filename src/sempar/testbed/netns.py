"""Network-namespace testbed: G hosts on one bridge, every directed pair's bandwidth shaped.

Layout of a testbed named `T` with G hosts (all names start with `sempar-`):

- namespace `sempar-T-br` holds bridge `br0` and one port `p<i>` per host;
- namespace `sempar-T-h<i>` holds `eth0` (the other end of `p<i>`) with address 10.77.0.<i+1>/24
  and `lo`. Addresses live only inside our own namespaces: nothing is added to the root one.
- shaping (`testbed/shaping.py`): htb classes per destination on each host's egress `eth0`.

State: one JSON file per testbed under `$SEMPAR_TESTBED_DIR` (default /run/sempar-testbed), so
`down` finds everything; `down_all` also removes stray `sempar-*` namespaces, but never a testbed
whose owner process is alive (a running bench's). Create and destroy hold an exclusive lock
(`flock` on `.lock` in that folder), so two racing `up --name X` cannot interleave and the loser's
cleanup cannot remove the winner's namespaces; a testbed's namespaces are matched by exact name
(`sempar-T-br`, `sempar-T-h<i>`), never by prefix. `testbed()` is a context manager that always
tears down (finally, atexit, SIGTERM/SIGHUP/SIGINT; further signals are ignored while it does).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sempar.atomic import write_text_atomic
from sempar.comm.topology import Topology
from sempar.errors import InputError
from sempar.testbed.shaping import DEFAULT_SCALE, host_addr, shaped_rates, tc_script

PREFIX = "sempar-"
DEFAULT_TTL_S = 3600.0
CMD_TIMEOUT_S = 20.0


class TestbedError(RuntimeError):
    """The environment refused (not root, no `ip`/`tc`, a command failed): exit code 1."""

    __test__ = False    # not a pytest class


def state_dir() -> Path:
    return Path(os.environ.get("SEMPAR_TESTBED_DIR", "/run/sempar-testbed"))


# ---- capability -----------------------------------------------------------------------------
def netns_available() -> tuple[bool, str]:
    """(True, "") when we are root and `ip netns` / veth / bridge / htb work, else (False, why).

    Probes by creating and deleting a namespace; never raises."""
    if os.name != "posix" or os.geteuid() != 0:
        return False, "not root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"no `{tool}` command"
    probe = f"{PREFIX}probe-{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe])
        try:
            _run(["ip", "netns", "exec", probe, "ip", "link", "add", "br0", "type", "bridge"])
            _run(["ip", "netns", "exec", probe, "ip", "link", "add", "a0", "type", "veth",
                  "peer", "name", "b0"])
            _run(["ip", "netns", "exec", probe, "ip", "link", "set", "a0", "up"])
            _run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "a0", "root",
                  "handle", "1:", "htb", "default", "1"])
        finally:
            _run(["ip", "netns", "delete", probe], check=False)
    except (TestbedError, OSError) as e:
        return False, str(e)
    return True, ""


def _run(cmd: list[str], check: bool = True, input: str | None = None) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=CMD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(cmd)}` took more than {CMD_TIMEOUT_S:.0f} s") from None
    except FileNotFoundError:
        raise TestbedError(f"`{cmd[0]}` not found (the testbed needs iproute2)") from None
    if check and r.returncode != 0:
        msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise TestbedError(f"`{' '.join(cmd)}` failed: {msg[-1] if msg else r.returncode}")
    return r.stdout


# ---- the testbed -----------------------------------------------------------------------------
@dataclass
class Testbed:
    name: str
    hosts: int
    preset: str
    scale: float
    rates: list            # [G][G] shaped bytes/s
    node_of: list          # [G] node ids of the shaped topology
    created: float = field(default_factory=time.time)
    expires: float = 0.0
    owner_pid: int = field(default_factory=os.getpid)

    @property
    def bridge_ns(self) -> str:
        return f"{PREFIX}{self.name}-br"

    def host_ns(self, i: int) -> str:
        return f"{PREFIX}{self.name}-h{i}"

    @property
    def namespaces(self) -> list[str]:
        return [self.host_ns(i) for i in range(self.hosts)] + [self.bridge_ns]

    def addr(self, i: int) -> str:
        return host_addr(i)

    @property
    def state_file(self) -> Path:
        return state_dir() / f"{self.name}.json"

    def to_json(self) -> dict:
        d = asdict(self)
        d["namespaces"] = self.namespaces
        d["addresses"] = [self.addr(i) for i in range(self.hosts)]
        return d


def _check_name(name: str) -> str:
    if not name or len(name) > 20 or not all(c.isalnum() or c == "-" for c in name):
        raise InputError(f"testbed name {name!r} must be 1-20 letters, digits or '-'")
    return name


_thread_lock = threading.RLock()
_lock_depth = [0]


@contextlib.contextmanager
def state_lock() -> Iterator[None]:
    """Exclusive lock over every testbed's create/destroy: `flock` between processes, an RLock
    between threads; re-entrant in the thread that holds it."""
    with _thread_lock:
        if _lock_depth[0]:
            _lock_depth[0] += 1
            try:
                yield
            finally:
                _lock_depth[0] -= 1
            return
        d = state_dir()
        d.mkdir(parents=True, exist_ok=True)
        with open(d / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            _lock_depth[0] = 1
            try:
                yield
            finally:
                _lock_depth[0] = 0
                fcntl.flock(fh, fcntl.LOCK_UN)


def namespaces_of(name: str, present: list[str]) -> list[str]:
    """The namespaces in `present` that belong to testbed `name`, matched exactly."""
    pat = re.compile(rf"{re.escape(PREFIX + name)}-(br|h\d+)")
    return [ns for ns in present if pat.fullmatch(ns)]


def existing_namespaces() -> list[str]:
    if shutil.which("ip") is None:
        return []
    out = _run(["ip", "netns", "list"], check=False)
    return [ln.split()[0] for ln in out.splitlines() if ln.strip().startswith(PREFIX)]


def create(hosts: int, topo: Topology, scale: float = DEFAULT_SCALE, name: str | None = None,
           preset: str = "", ttl_s: float = DEFAULT_TTL_S) -> Testbed:
    """Bring up the namespaces, bridge, addresses and shaping; on any failure remove what was
    made and raise TestbedError. Writes the state file before creating anything."""
    if topo.num_devices != hosts:
        raise InputError(f"topology {topo.name} has {topo.num_devices} devices, not {hosts}")
    rates = shaped_rates(topo, scale)
    ok, why = netns_available()
    if not ok:
        raise TestbedError(f"the testbed needs root with `ip netns`, veth, bridge and tc htb: {why}")
    reap_expired()
    name = _check_name(name or f"t{os.getpid()}")
    tb = Testbed(name, hosts, preset or topo.name, float(scale), rates.tolist(),
                 topo.node_of.tolist(), expires=time.time() + ttl_s)
    with state_lock():
        clash = namespaces_of(name, existing_namespaces())
        if clash or tb.state_file.exists():
            raise InputError(f"testbed {name} already exists "
                             f"({sorted(clash)[0] if clash else tb.state_file}); "
                             f"`sempar testbed down {name}` first")
        write_text_atomic(tb.state_file, json.dumps(tb.to_json()) + "\n")
        try:
            _bring_up(tb, rates)
        except BaseException:
            destroy(tb)       # only this testbed's namespaces: the clash check ran under the lock
            raise
    return tb


def _bring_up(tb: Testbed, rates: np.ndarray) -> None:
    br = tb.bridge_ns
    _run(["ip", "netns", "add", br])
    nsx = ["ip", "netns", "exec"]
    _run(nsx + [br, "ip", "link", "add", "br0", "type", "bridge"])
    _run(nsx + [br, "ip", "link", "set", "br0", "up"])
    for i in range(tb.hosts):
        ns = tb.host_ns(i)
        _run(["ip", "netns", "add", ns])
        _run(nsx + [br, "ip", "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0",
                    "netns", ns])
        _run(nsx + [br, "ip", "link", "set", f"p{i}", "master", "br0"])
        _run(nsx + [br, "ip", "link", "set", f"p{i}", "up"])
        _run(nsx + [ns, "ip", "link", "set", "lo", "up"])
        _run(nsx + [ns, "ip", "addr", "add", f"{tb.addr(i)}/24", "dev", "eth0"])
        _run(nsx + [ns, "ip", "link", "set", "eth0", "up"])
        _run(nsx + [ns, "tc", "-batch", "-"], input=tc_script(rates[i], i))


def destroy(tb: Testbed | str) -> list[str]:
    """Delete the testbed's namespaces (their veths and bridge go with them) and its state file;
    returns the namespaces removed. Never raises for what is already gone."""
    with state_lock():
        if isinstance(tb, str):
            tb = load_state(_check_name(tb)) or Testbed(tb, 0, "", 1.0, [], [])
        present = existing_namespaces()
        removed = []
        for ns in sorted(set(namespaces_of(tb.name, present))):
            _run(["ip", "netns", "delete", ns], check=False)
            removed.append(ns)
        with contextlib.suppress(FileNotFoundError):
            tb.state_file.unlink()
    return removed


def load_state(name: str) -> Testbed | None:
    p = state_dir() / f"{name}.json"
    try:
        d = json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    keys = Testbed.__dataclass_fields__
    return Testbed(**{k: v for k, v in d.items() if k in keys})


def list_testbeds() -> list[Testbed]:
    d = state_dir()
    if not d.is_dir():
        return []
    return [tb for p in sorted(d.glob("*.json")) if (tb := load_state(p.stem)) is not None]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_expired() -> list[str]:
    """Remove testbeds past their expiry time (`up --ttl`) whose owner is gone; returns the
    namespaces removed."""
    removed: list[str] = []
    for tb in list_testbeds():
        if tb.expires and tb.expires < time.time() and not in_use(tb):
            removed += destroy(tb)
    return removed


def in_use(tb: Testbed) -> bool:
    """Whether another live process (a running bench, profile) owns the testbed."""
    return tb.owner_pid != os.getpid() and _pid_alive(tb.owner_pid)


def down_all() -> tuple[list[str], list[Testbed]]:
    """Remove every recorded testbed whose owner is gone, and stray `sempar-*` namespaces.

    Returns (namespaces removed, testbeds kept because their owner process is alive)."""
    removed: list[str] = []
    kept: list[Testbed] = []
    with state_lock():
        for tb in list_testbeds():
            if in_use(tb):
                kept.append(tb)
            else:
                removed += destroy(tb)
        keep = {ns for tb in kept for ns in tb.namespaces}
        for ns in existing_namespaces():
            if ns not in keep:
                _run(["ip", "netns", "delete", ns], check=False)
                removed.append(ns)
    return removed, kept


# ---- always tear down ------------------------------------------------------------------------
class _Signalled(BaseException):
    pass


@contextlib.contextmanager
def teardown_guard(cleanup) -> Iterator[None]:
    """Run `cleanup()` exactly once on normal exit, exception, SIGTERM/SIGHUP/SIGINT or atexit."""
    done = [False]

    def once() -> None:
        if not done[0]:
            done[0] = True
            # A second Ctrl-C (or TERM/HUP) must not abort the teardown half-way.
            held = {}
            for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                with contextlib.suppress(ValueError, OSError):
                    held[s] = signal.signal(s, signal.SIG_IGN)
            try:
                cleanup()
            finally:
                for s, h in held.items():
                    signal.signal(s, h)

    def on_signal(signum, frame):
        raise _Signalled(f"signal {signal.Signals(signum).name}")

    old = {}
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        with contextlib.suppress(ValueError, OSError):     # not the main thread
            old[s] = signal.signal(s, on_signal)
    atexit.register(once)
    try:
        yield
    except _Signalled as e:
        raise TestbedError(f"interrupted by {e}; testbed torn down") from None
    finally:
        once()
        atexit.unregister(once)
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def testbed(hosts: int, topo: Topology, scale: float = DEFAULT_SCALE, name: str | None = None,
            preset: str = "", ttl_s: float = DEFAULT_TTL_S) -> Iterator[Testbed]:
    """A testbed that exists for the `with` block only, whatever happens inside."""
    box: list[Testbed] = []
    nm = _check_name(name or f"t{os.getpid()}")
    with teardown_guard(lambda: box and destroy(box[0])):
        box.append(create(hosts, topo, scale, nm, preset, ttl_s))
        yield box[0]


testbed.__test__ = False    # type: ignore[attr-defined]
