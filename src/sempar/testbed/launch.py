"""Run one Python rank per testbed host (or per local process on loopback), gloo over TCP.

`launch(entry, hosts, args, tb=...)` starts `python -m sempar.testbed.launch --entry mod:func ...`
in every namespace (`ip netns exec sempar-T-h<r> ...`), MASTER = rank 0's address, GLOO pinned to
`eth0` (testbed) or `lo` (loopback). Each rank calls `func(rank, world, **args)`; rank 0's return
value (JSON) comes back. Bounds, so that nothing hangs:

- every collective / send / recv and the rendezvous time out after `op_timeout_s` (gloo);
- when a rank fails, the others get `grace_s` to exit by themselves (a dead peer closes its
  sockets: they fail at once; a hung one makes them time out), then they are killed;
- the whole run is killed after `timeout_s`;
- ranks die with their launcher, even when it is SIGKILLed or OOM-killed: each rank gets the
  parent-death signal SIGKILL (Linux `prctl(PR_SET_PDEATHSIG)`, kept across `ip netns exec`'s
  exec) and, where prctl is missing, a watchdog thread that exits once its parent is gone.

The work folder (args, logs, result) is removed after a successful run; a failed run keeps it
and names it in the error.

A failed run raises `LaunchError` naming the first rank that failed and its last error line.
Fault injection for tests: env SEMPAR_TESTBED_FAULT="RANK:die[:AFTER_S]" or "RANK:hang[:AFTER_S]"
(`hang` stops the process with SIGSTOP, as a wedged rank would look).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from sempar.testbed.netns import Testbed, TestbedError, teardown_guard

TESTBED_PORT = 29500
RANK_FAILED = 3


class LaunchError(TestbedError):
    """A rank failed, hung or the run overran its time limit."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return ""
    for ln in reversed(lines):
        if ln.startswith("rank "):
            return ln
    return lines[-1] if lines else ""


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL me when the launcher dies (Linux; else a no-op)."""
    with contextlib.suppress(Exception):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _watch_parent() -> None:
    """Exit when the launcher that started this rank is gone (the fallback of PDEATHSIG)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(RANK_FAILED)

    threading.Thread(target=watch, daemon=True).start()


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def launch(entry: str, hosts: int, args: dict[str, Any] | None = None, *,
           tb: Testbed | None = None, timeout_s: float = 300.0, op_timeout_s: float = 30.0,
           grace_s: float = 5.0, fault: str | None = None) -> Any:
    """Run `entry` ("package.module:function") on `hosts` ranks; return rank 0's result."""
    if tb is not None and tb.hosts != hosts:
        raise TestbedError(f"testbed {tb.name} has {tb.hosts} hosts, not {hosts}")
    work = Path(tempfile.mkdtemp(prefix="sempar-launch-"))
    (work / "args.json").write_text(json.dumps(args or {}))
    master = tb.addr(0) if tb else "127.0.0.1"
    port = TESTBED_PORT if tb else _free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0" if tb else "lo", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("SEMPAR_TESTBED_FAULT", None)
    if fault:
        env["SEMPAR_TESTBED_FAULT"] = fault
    procs: list[subprocess.Popen] = []

    def kill_all() -> None:
        for p in procs:
            _kill(p)

    start = time.monotonic()
    with teardown_guard(kill_all):
        for r in range(hosts):
            cmd = ["ip", "netns", "exec", tb.host_ns(r)] if tb else []
            cmd += [sys.executable, "-m", "sempar.testbed.launch", "--entry", entry,
                    "--rank", str(r), "--world", str(hosts), "--master", master, "--port",
                    str(port), "--work", str(work), "--op-timeout", str(op_timeout_s)]
            log = open(work / f"rank{r}.log", "w")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True, preexec_fn=_die_with_parent))
            log.close()
        first_fail: tuple[int, int, float] | None = None   # rank, code, when
        overran = False
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            for r, p in enumerate(procs):
                if first_fail is None and p.poll() not in (None, 0):
                    first_fail = (r, p.returncode, now)
            if now - start > timeout_s:
                overran = True
                break
            if first_fail is not None and now - first_fail[2] > grace_s:
                break
            time.sleep(0.05)
        stuck = [r for r, p in enumerate(procs) if p.poll() is None]
    elapsed = time.monotonic() - start
    codes = [p.returncode for p in procs]
    if first_fail is None:          # ranks we killed after an overrun did not fail by themselves
        bad = [r for r, c in enumerate(codes) if c != 0 and r not in stuck]
        first_fail = (bad[0], codes[bad[0]], 0.0) if bad else None
    if first_fail is not None and _lost_peer(work, first_fail[0]):
        # Ranks that lose a peer exit within milliseconds of it, so polling may see one of them
        # first: name the rank whose own error is not a lost peer, when there is one.
        cause = [q for q, c in enumerate(codes) if c not in (0, None) and q not in stuck
                 and not _lost_peer(work, q)]
        if cause:
            first_fail = (cause[0], codes[cause[0]], first_fail[2])
    if overran or first_fail is not None:
        parts = []
        if overran:
            parts.append(f"run exceeded its {timeout_s:g} s limit")
        if first_fail is not None:
            r, c, _ = first_fail
            why = _last_line(work / f"rank{r}.log") or "no output"
            parts.append(f"rank {r} failed first ({_describe(c)}): {why}")
            others = [f"{q} ({_describe(codes[q])})" for q in range(hosts)
                      if q != r and codes[q] not in (0, None) and q not in stuck]
            if others:
                parts.append("then " + ", ".join(f"rank {o}" for o in others) + " exited with errors")
        if stuck:
            parts.append(f"killed ranks still running: {stuck}")
        raise LaunchError(f"{'; '.join(parts)} after {elapsed:.1f} s (logs: {work})")
    try:
        result = json.loads((work / "result.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        raise LaunchError(f"rank 0 exited cleanly but wrote no result (logs: {work})") from None
    shutil.rmtree(work, ignore_errors=True)     # our own mkdtemp: args, logs, result
    return result


def _describe(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


# ---- the rank side ---------------------------------------------------------------------------
def _install_fault(rank: int) -> None:
    spec = os.environ.get("SEMPAR_TESTBED_FAULT", "")
    if not spec:
        return
    parts = spec.split(":")
    if int(parts[0]) != rank:
        return
    mode, after = parts[1], float(parts[2]) if len(parts) > 2 else 0.0

    def fire() -> None:
        sys.stderr.write(f"rank {rank}: injected fault: {mode}\n")
        sys.stderr.flush()
        if mode == "die":
            os._exit(17)
        os.kill(os.getpid(), signal.SIGSTOP)

    if after <= 0:
        fire()
    else:
        threading.Timer(after, fire).start()


def rank_main(argv: list[str] | None = None) -> NoReturn:
    ap = argparse.ArgumentParser()
    for opt in ("--entry", "--master", "--work"):
        ap.add_argument(opt, required=True)
    for opt in ("--rank", "--world", "--port"):
        ap.add_argument(opt, type=int, required=True)
    ap.add_argument("--op-timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    _watch_parent()
    work = Path(a.work)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank,
                                world_size=a.world, timeout=timedelta(seconds=a.op_timeout))
        _install_fault(a.rank)
        mod, _, fn = a.entry.partition(":")
        func = getattr(importlib.import_module(mod), fn)
        result = func(a.rank, a.world, **json.loads((work / "args.json").read_text()))
        if a.rank == 0:
            tmp = work / "result.json.tmp"
            tmp.write_text(json.dumps(result))
            os.replace(tmp, work / "result.json")
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the launcher reports it
        msg = " ".join(str(e).split())[:400]
        kind = ("lost or timed out waiting for a peer" if any(
            k in msg.lower() for k in ("connection", "timed out", "timeout", "closed", "reset"))
            else type(e).__name__)
        sys.stderr.write(f"rank {a.rank}: {kind}: {msg}\n")
        sys.stderr.flush()
        os._exit(RANK_FAILED)      # skip gloo's destructors, which may block on a dead peer
    # The work is done and rank 0's result is on disk: leave without running C++ static
    # destructors, where a torch/gloo thread still joinable at exit aborts the process
    # ("terminate called without an active exception", SIGABRT) now and then.
    # Non-daemon threads (an injected fault's timer) are waited for, as the interpreter would.
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)



def _lost_peer(work: Path, rank: int) -> bool:
    """Whether a rank's last words say it only lost a peer (a consequence, not a cause)."""
    return "lost or timed out waiting for a peer" in (_last_line(work / f"rank{rank}.log") or "")


if __name__ == "__main__":
    rank_main()
