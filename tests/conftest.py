"""Shared helpers for the trace tests: small synthetic traces, unchecked writers, file surgery,
and a runner for the `sempar` command in a subprocess. The corrupted trace files (`bad_file`)
are in bad_traces.py, beside test_trace_io.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sempar.trace import RoutingTrace, TraceMeta, TraceWriter
from sempar.trace.io import META_KEY, SUM_KEY, block_checksum

pytest_plugins = ("bad_traces", "hostile")   # the `bad_file`, `hostile_files` fixtures

# The default trace: 200 tokens in 20 requests of 10 tokens, L=3 layers, N=8 experts, top-2.
# Requests 0,2,...,18 are "code" (100 tokens), 1,3,...,17 are "math" (90 tokens) and request 19
# has no domain (10 tokens).
T_DEFAULT, R_DEFAULT = 200, 20


def build_trace(T: int = T_DEFAULT, R: int = R_DEFAULT, L: int = 3, N: int = 8, k: int = 2,
                vocab: int = 1000, weights: bool = True,
                domains: tuple[str, ...] | None = ("code", "math"), seed: int = 0,
                groups: tuple[int, int] = (1, 1), **meta_kw: Any) -> RoutingTrace:
    """A valid trace; with `groups=(G, g)` every top-k stays inside at most g of G groups."""
    assert R == 0 or T % R == 0
    rng = np.random.default_rng(seed)
    G, tg = groups
    meta = TraceMeta(model=meta_kw.pop("model", "toy-moe"), num_layers=L, num_experts=N, top_k=k,
                     vocab_size=vocab, num_expert_groups=G, topk_groups=tg, **meta_kw)
    per_group = N // G
    assert k <= tg * per_group
    allowed = np.argsort(rng.random((T, L, G)), axis=2)[:, :, :tg]          # groups used per row
    cand = (allowed[..., None] * per_group + np.arange(per_group)).reshape(T, L, tg * per_group)
    pick = np.argsort(rng.random((T, L, tg * per_group)), axis=2)[:, :, :k]
    experts = np.take_along_axis(cand, pick, axis=2).astype(meta.expert_dtype)
    per_req = T // R if R else 0
    request_id = np.repeat(np.arange(R), per_req).astype(np.int32)
    position = np.tile(np.arange(per_req), R).astype(np.int32)
    token_id = rng.integers(0, vocab, T).astype(np.int32)
    domain = None
    names: list[str] = []
    if domains is not None:
        names = list(domains)
        domain = (request_id % max(len(names), 1)).astype(np.int16)
        domain[request_id == R - 1] = -1
    w = None
    if weights:
        w = -np.sort(-rng.random((T, L, k)), axis=2).astype(np.float32)
    return RoutingTrace(meta=meta, token_id=token_id, request_id=request_id, position=position,
                        experts=experts, domain=domain, domains=names, weights=w)


def copy_trace(t: RoutingTrace) -> RoutingTrace:
    return RoutingTrace(meta=t.meta, token_id=t.token_id.copy(), request_id=t.request_id.copy(),
                        position=t.position.copy(), experts=t.experts.copy(),
                        domain=None if t.domain is None else t.domain.copy(),
                        domains=list(t.domains),
                        weights=None if t.weights is None else t.weights.copy())


def write_unchecked(trace: RoutingTrace, path: Path, row_group_size: int = 16,
                    format_version: int | None = None) -> Path:
    """Write a trace through `TraceWriter` without validation (to put bad rows on disk)."""
    kw = {} if format_version is None else {"format_version": format_version}
    with TraceWriter(path, trace.meta, trace.domains if trace.domain is not None else None,
                     has_weights=trace.weights is not None, validate=False, **kw) as w:
        for lo in range(0, trace.num_tokens, row_group_size):
            sl = slice(lo, lo + row_group_size)
            w.write(trace.token_id[sl], trace.request_id[sl], trace.position[sl],
                    trace.experts[sl], None if trace.domain is None else trace.domain[sl],
                    None if trace.weights is None else trace.weights[sl])
    return path


def read_block(path: Path) -> dict[str, Any]:
    return json.loads(pq.ParquetFile(path).metadata.metadata[META_KEY])


def rewrite(src: Path, dst: Path, block_edit: Callable[[dict], Any] | None = None,
            table_edit: Callable[[pa.Table], pa.Table] | None = None,
            raw_block: bytes | None = None, row_group_size: int = 16,
            seal: bool = True) -> Path:
    """Copy a trace file by hand with pyarrow, editing its table and/or its metadata block.

    `seal`: store the edited block's checksum (as a writer would) when the source had one, so
    the readers' checks behind the checksum are reached; False drops it."""
    pf = pq.ParquetFile(src)
    kv = pf.metadata.metadata
    block = json.loads(kv[META_KEY])
    table = pf.read()
    if table_edit is not None:
        table = table_edit(table)
    if block_edit is not None:
        block_edit(block)
    payload = raw_block if raw_block is not None else json.dumps(block).encode()
    meta = {META_KEY: payload}
    if seal and SUM_KEY in kv:
        meta[SUM_KEY] = block_checksum(payload)
    table = table.replace_schema_metadata(meta)
    pq.write_table(table, dst, row_group_size=row_group_size)
    return dst


def replace_column(table: pa.Table, name: str, array: pa.Array, nullable: bool = False) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, pa.field(name, array.type, nullable=nullable), array)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sempar.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


@pytest.fixture
def make_trace() -> Callable[..., RoutingTrace]:
    return build_trace


@pytest.fixture
def trace() -> RoutingTrace:
    return build_trace()


@pytest.fixture(scope="session")
def moe64_split():
    """(fit, eval): the committed tiny-moe64 dev trace split 20/80 by request (seed 0), read once
    per test session; skips when the dev trace is absent. Tests must not modify it."""
    from sempar.paths import dev_trace_paths
    from sempar.trace import read_trace, split_by_request

    paths = {p.stem: p for p in dev_trace_paths()}
    if "tiny-moe64" not in paths:
        pytest.skip("tiny-moe64 dev trace not committed")
    return split_by_request(read_trace(paths["tiny-moe64"]), 0.2, seed=0)


# ---- serving forecasts -----------------------------------------------------------------------

TINY = Path(__file__).resolve().parents[1] / "src" / "sempar" / "assets" / "traces" / "tiny-moe64.parquet"


def _slow_accelerator():
    from sempar.serving.hardware import Accelerator

    return Accelerator("test", 2e10, 2e9, 16e9, flops_eff=1.0, bw_eff=1.0)


# a slow device, so that the tiny model saturates at a few hundred requests/s
SLOW = _slow_accelerator()


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    """The first 400 requests of tiny-moe64's dev trace (serving forecasts and rate searches)."""
    from sempar.trace import read_trace, write_trace

    tr = read_trace(TINY)
    keep = np.isin(tr.request_id, np.unique(tr.request_id)[:400])
    p = tmp_path_factory.mktemp("serve") / "small.parquet"
    write_trace(tr.take(keep), p)
    return p


# ---- the demo, run once -----------------------------------------------------------------------

DEMO_ENV = "SEMPAR_TEST_DEMO"


@pytest.fixture(scope="session")
def demo_out(tmp_path_factory) -> Path:
    """The folder of one `sempar demo` run, shared by every test that reads it.

    $SEMPAR_TEST_DEMO names a folder the same checkout's `sempar demo --out` already wrote (.ci/run
    points it at what README's first command wrote, so CI runs the demo once, as a new user
    does, and checks that run); else the demo runs here once per session (4-5 minutes)."""
    import os

    given = os.environ.get(DEMO_ENV)
    if given:
        out = Path(given)
        assert (out / "summary.json").is_file(), f"${DEMO_ENV}={given}: no demo output there"
        return out
    out = tmp_path_factory.mktemp("demo") / "demo"
    r = run_cli("demo", "--out", out, cwd=out.parent, timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    (out.parent / "demo.stdout").write_text(r.stdout)
    return out


DEMO_STDOUT_ENV = "SEMPAR_TEST_DEMO_STDOUT"


@pytest.fixture(scope="session")
def demo_stdout(demo_out) -> str:
    """What that demo run printed on the terminal: $SEMPAR_TEST_DEMO_STDOUT (.ci/run keeps the
    output of README's first command there), else the run `demo_out` made itself."""
    import os

    given = os.environ.get(DEMO_STDOUT_ENV)
    if given:
        return Path(given).read_text(errors="replace")
    kept = demo_out.parent / "demo.stdout"
    if not kept.is_file():
        pytest.skip(f"${DEMO_ENV} is set without ${DEMO_STDOUT_ENV}: the demo's terminal output "
                    "was not kept")
    return kept.read_text()


# ---- which tests skipped (.ci/run re-runs them once the extras are installed) ----------------

def _record_skip(nodeid: str) -> None:
    import os

    where = os.environ.get("SEMPAR_TEST_SKIPPED")
    if where:
        with open(where, "a") as f:
            f.write(nodeid + "\n")


def pytest_runtest_logreport(report) -> None:
    """With $SEMPAR_TEST_SKIPPED set, append the id of every skipped test (and of every test file
    skipped whole, below) to that file, one a line, duplicates possible: .ci/run runs them again
    once the extras are installed, with shared/ beside the checkout."""
    if report.skipped and report.when in ("setup", "call") and not hasattr(report, "wasxfail"):
        _record_skip(report.nodeid)


def pytest_collectreport(report) -> None:
    if report.skipped:
        _record_skip(report.nodeid)


# ---- order: the heavy files first -------------------------------------------------------------

def pytest_collection_modifyitems(config, items) -> None:
    """The files that hold a `slow` test run first, each file's tests kept together (its module
    fixtures are made once) and in their order: with workers (`-n auto --dist loadscope`, the
    README's command) the long files start at once instead of leaving one worker alone at the
    end."""
    heavy = {it.module.__name__ for it in items if it.get_closest_marker("slow") is not None
             and getattr(it, "module", None) is not None}
    order = {id(it): i for i, it in enumerate(items)}
    items.sort(key=lambda it: (getattr(getattr(it, "module", None), "__name__", None) not in heavy,
                               order[id(it)]))


# ---- workers: the tests that make network namespaces run on one --------------------------------

# Network namespaces are the machine's: a test that checks that its testbed is gone (no namespace
# more than before it) fails when another worker's testbed test runs meanwhile.
ONE_WORKER = ("tests/testbed/", "tests/bench/test_bench.py::test_testbed_run")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` (README's command) with the ONE_WORKER tests as one scope: each file's
    tests on one worker (module fixtures made once), every namespace test on the same one."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(ONE_WORKER):
                return "network namespaces"
            return super()._split_scope(nodeid)

    return Scheduling(config, log)

