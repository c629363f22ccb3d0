"""Process groups for the EP runtime: init with a timeout, local spawning, clear failures.

- `init(rank, world, ...)`: `torch.distributed.init_process_group` over gloo (CPU) or NCCL (one
  GPU per rank where `torch.cuda.device_count() >= world`), TCP rendezvous at
  `MASTER_ADDR:MASTER_PORT` (env, or arguments: the testbed runs ranks in network namespaces
  and points them at the namespace address). Every collective inherits `timeout`: a peer that
  died makes the others' next collective fail at once (gloo: connection closed) and a peer that
  hangs makes it fail after `timeout` seconds.
- `launch(fn, world, args)`: spawn `world` local processes (torch.multiprocessing, spawn
  context), run `fn(rank, world, port, *args)` in each, and return the per-rank results. The
  parent watches them: when one rank exits with an error, dies or overruns `deadline`, the
  others get `grace` seconds to fail on their own, then are terminated, and `RankFailure` is
  raised naming the first rank that failed and its error. Nothing hangs past `deadline`.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist


class RankFailure(RuntimeError):
    """A rank died, hung or raised; the message names the rank and the collective."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pick_backend(world: int) -> tuple[str, torch.device]:
    """("nccl", cuda:local_rank) when every rank can have a GPU, else ("gloo", cpu)."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world:
        return "nccl", torch.device("cuda")
    return "gloo", torch.device("cpu")


def init(rank: int, world: int, port: int | None = None, addr: str | None = None,
         timeout: float = 30.0, backend: str | None = None) -> torch.device:
    """Join the process group; returns the device this rank computes on."""
    addr = addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(port or os.environ.get("MASTER_PORT", "29511"))
    chosen, device = pick_backend(world)
    backend = backend or chosen
    if backend == "gloo":
        device = torch.device("cpu")
    elif device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout))
    return device


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _worker(fn: Callable, rank: int, world: int, port: int, out_dir: str, threads: int,
            args: tuple) -> None:
    torch.set_num_threads(threads)
    out = Path(out_dir)
    try:
        result = fn(rank, world, port, *args)
        (out / f"rank{rank}.tmp").write_bytes(pickle.dumps(result))
        os.replace(out / f"rank{rank}.tmp", out / f"rank{rank}.ok")
    except BaseException as err:  # noqa: BLE001 - reported to the parent, then re-raised
        msg = f"{type(err).__name__}: {err}"
        (out / f"rank{rank}.err").write_text(msg + "\n" + traceback.format_exc())
        shutdown()
        os._exit(1)
    shutdown()
    # The result is on disk. Leave without the interpreter's teardown: destroying torch's C++
    # statics while a gloo or store thread is still joinable aborts the process ("terminate
    # called without an active exception", exit -6), seen about once in a full CI run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(fn: Callable, world: int, args: tuple = (), deadline: float = 120.0,
           grace: float = 20.0, threads: int = 1) -> list[Any]:
    """Run `fn(rank, world, port, *args)` in `world` spawned processes; the results by rank.

    `fn` must be importable (a module-level function). Raises `RankFailure` when any rank fails,
    with the first failing rank's error; never waits longer than `deadline` (+ `grace`)."""
    ctx = torch.multiprocessing.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sempar-rt-") as tmp:
        procs = [ctx.Process(target=_worker, args=(fn, r, world, port, tmp, threads, args),
                             daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        t0 = time.monotonic()
        first_fail: tuple[int, str] | None = None
        fail_time = None
        try:
            while True:
                alive = [p.is_alive() for p in procs]
                for r, p in enumerate(procs):
                    if not alive[r] and p.exitcode not in (0, None) and first_fail is None:
                        err = Path(tmp, f"rank{r}.err")
                        text = err.read_text().splitlines()[0] if err.is_file() else \
                            f"process exited with code {p.exitcode} (killed or crashed)"
                        first_fail, fail_time = (r, text), time.monotonic()
                if not any(alive):
                    break
                now = time.monotonic()
                if first_fail is not None and now - fail_time > grace:
                    break
                if now - t0 > deadline:
                    if first_fail is None:
                        hung = [r for r, a in enumerate(alive) if a]
                        first_fail = (hung[0], f"did not finish within {deadline:.0f} s "
                                               f"(ranks {hung} still running)")
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
        if first_fail is None:
            missing = [r for r in range(world) if not Path(tmp, f"rank{r}.ok").is_file()]
            if missing:
                first_fail = (missing[0], "exited without a result")
        if first_fail is not None:
            r, text = first_fail
            others = []
            for q in range(world):
                e = Path(tmp, f"rank{q}.err")
                if q != r and e.is_file():
                    others.append(f"rank {q}: {e.read_text().splitlines()[0]}")
            tail = f"; then {'; '.join(others)}" if others else ""
            raise RankFailure(f"rank {r} failed: {text}{tail}")
        return [pickle.loads(Path(tmp, f"rank{r}.ok").read_bytes()) for r in range(world)]
