"""placement/sempar/_pool.py: per-layer work in forked workers, results in layer order."""

from __future__ import annotations

import os

import numpy as np
import pytest

from sempar.placement.sempar._pool import map_layers, usable_cpus

BIG = np.arange(1_000_000, dtype=np.int64)      # read by the workers without being sent


def _layer(l: int) -> tuple[int, int, np.ndarray]:
    return l, os.getpid(), BIG[l::7][:5] * l


def test_workers_return_layers_in_order_as_serial():
    serial = map_layers(_layer, 20, 1)
    par = map_layers(_layer, 20, 3, block=4)
    assert [r[0] for r in par] == list(range(20))
    for s, p in zip(serial, par):
        assert np.array_equal(s[2], p[2])
    assert {r[1] for r in serial} == {os.getpid()}                   # jobs 1: in-process
    assert os.getpid() not in {r[1] for r in par}                    # jobs 3: forked workers
    blocks = [{r[1] for r in par[b:b + 4]} for b in range(0, 20, 4)]
    assert all(len(b) == 1 for b in blocks)                          # a block stays together


def test_one_layer_or_one_job_stays_here():
    assert map_layers(_layer, 1, 4)[0][1] == os.getpid()
    assert usable_cpus() >= 1


def _nested(l: int) -> list:
    return [r[1] for r in map_layers(_layer, 3, 2)]


def test_no_nested_pools():
    for pids in map_layers(_nested, 2, 2):
        assert len(set(pids)) == 1 and pids[0] != os.getpid()       # inner map ran serially


def _blas_threads(l: int) -> list[int]:
    from threadpoolctl import threadpool_info

    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_one_blas_thread_in_workers_and_serially():
    for jobs in (1, 2):
        for threads in map_layers(_blas_threads, 2, jobs):
            assert all(t == 1 for t in threads)


def _dies(l: int) -> int:
    if l == 1:
        os._exit(9)
    return l


def test_a_dying_worker_raises_instead_of_hanging():
    from concurrent.futures.process import BrokenProcessPool

    with pytest.raises(BrokenProcessPool):
        map_layers(_dies, 4, 2)
