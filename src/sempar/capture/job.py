"""`sempar capture`: send prompts to a running engine with routed-expert return switched on and
stream the routing of every request (prefill and decode rows) into a trace.

Requests are numbered 0..N-1 (request i sends prompt i mod P); at most `concurrency` are in
flight and results are written in request order (a window of `4 x concurrency` requests ahead
of the oldest unwritten one bounds memory), so a trace holds a prefix of the requests. Request i
is trace request i; its rows are positions [0, P_i + M_i - 1) (`rows.py`), the prompt's length
is kept per request in `meta.extra["capture"]["prompt_tokens"]` (`decode_mask` marks the decode
rows).

Resuming: the trace's `extra["capture"]` names the prompts file's digest and the settings; a run
whose `--out` already holds a capture with the same digest and settings copies its rows and sends
only the requests it lacks. SIGTERM / SIGINT / SIGHUP stop sending, drop the requests in flight
and write the requests done so far as a valid trace (exit 128 + signal); so does a failure after
some requests were written (exit 2). A failure before any is written leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Future, ThreadPoolExecutor
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sempar.capture.client import ClientConfig, EngineClient
from sempar.capture.engines import EngineSpec, engine
from sempar.capture.payload import PayloadShape
from sempar.capture.prompts import Prompts
from sempar.capture.rows import RequestRows, request_rows
from sempar.errors import InputError
from sempar.trace.io import TraceWriter
from sempar.trace.schema import TraceMeta

FLUSH_ROWS = 65536
WINDOW_PER_SLOT = 4          # requests ahead of the oldest unwritten one, per concurrency slot
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SETTINGS = ("engine", "prompts_sha256", "requests", "max_new_tokens", "seed", "model")


def _run_loop(coro) -> Any:
    """Run `coro` on a fresh event loop (uvloop's when installed: less per-request overhead)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


class Interrupted(Exception):
    """A signal stopped the run (its number)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@dataclass
class CaptureSettings:
    engine: str
    url: str
    requests: int
    max_new_tokens: int = 64
    seed: int | None = None
    client: ClientConfig = field(default_factory=ClientConfig)


def decode_mask(meta: TraceMeta, request_id: np.ndarray, position: np.ndarray) -> np.ndarray:
    """bool[T]: rows of a captured trace that are decode steps (position >= the prompt's length).
    Traces captured since the `decode` column exist carry it (`RoutingTrace.decode`); this
    reads the older ones' metadata."""
    lens = np.asarray(meta.extra["capture"]["prompt_tokens"], dtype=np.int64)
    return position >= lens[request_id]


def trace_meta(model: str, shape: dict[str, Any], extra: dict[str, Any]) -> TraceMeta:
    """The trace's model facts from `hf_config.config_shape` (layer ids out of the hidden layers).
    Slots are in the engine's order (`slots_sorted` False): SGLang 0.5.23's grouped and biased
    top-k (`layers/moe/topk.py`: `grouped_topk_gpu`, `biased_grouped_topk_impl`,
    `fused_topk_torch_native`) and vLLM 0.33.0's (`router/grouped_topk_router.py`,
    `fused_topk_bias_router.py`, unless VLLM_BATCH_INVARIANT) call `torch.topk(sorted=False)`,
    and neither engine returns the weights that would let us sort them."""
    layer_ids = tuple(shape["layer_ids"])
    return TraceMeta(model=model, num_layers=len(layer_ids), num_experts=shape["num_experts"],
                     top_k=shape["top_k"], vocab_size=shape["vocab_size"],
                     shared_experts=shape["shared_experts"],
                     num_expert_groups=shape["num_expert_groups"],
                     topk_groups=shape["topk_groups"], layer_ids=layer_ids,
                     num_hidden_layers=shape["num_hidden_layers"],
                     model_type=shape.get("model_type"), slots_sorted=False, extra=extra)


def _previous(out: Path, capture: dict[str, Any]) -> TraceMeta | None:
    """The meta of a capture at `out` to resume, None when `out` is absent or not a trace."""
    from sempar.trace.io import read_header

    if not out.exists() or not out.is_file():
        return None
    from sempar.atomic import release_input

    try:
        _, _, meta = read_header(out)
    except InputError as err:       # never replaced: a capture resumes only its own traces
        raise InputError(f"--out {out}: exists and is not a trace `sempar capture` can resume "
                         f"({str(err)[:200]}); give another --out") from None
    finally:
        release_input(out)          # our own earlier output: rewritten below, with its rows
    prev = meta.extra.get("capture") if isinstance(meta.extra, dict) else None
    if not isinstance(prev, dict):
        raise InputError(f"--out {out}: holds a trace that `sempar capture` did not write; give "
                         "another --out (capture resumes only its own traces)")
    for key in SETTINGS:
        if prev.get(key) != capture[key]:
            raise InputError(f"--out {out}: holds a capture with another {key} "
                             f"({prev.get(key)!r}, this run {capture[key]!r}); give another --out "
                             "or the same prompts and settings to resume it")
    return meta


class CaptureJob:
    """One capture run: `CaptureJob(...).run(out, progress)` -> summary dict."""

    def __init__(self, settings: CaptureSettings, prompts: Prompts, shape: dict[str, Any],
                 model: str, prompts_name: str, engine_version: str | None):
        self.s = settings
        self.spec: EngineSpec = engine(settings.engine)
        self.prompts = prompts
        self.payload_shape = PayloadShape(shape["num_hidden_layers"], shape["top_k"],
                                          shape["num_experts"], tuple(shape["layer_ids"]))
        self.capture = {"engine": settings.engine, "engine_version": engine_version,
                        "url": settings.url, "prompts": prompts_name,
                        "prompts_sha256": prompts.sha256, "requests": settings.requests,
                        "max_new_tokens": settings.max_new_tokens, "seed": settings.seed,
                        "model": model, "slot_order": "as the engine returned it",
                        "prompt_tokens": [], "prompt_ids": None}
        self.meta = trace_meta(model, shape, {"importer": "sempar.capture",
                                              "capture": self.capture})
        self.dtype = self.meta.expert_dtype
        self.retries = 0

    # ---- one request ---------------------------------------------------------------------

    async def _one(self, client: EngineClient, i: int) -> RequestRows:
        p = i % len(self.prompts.ids)
        ids = self.prompts.ids[p].tolist()
        body = self.spec.build(ids, self.s.max_new_tokens, self.s.seed)
        obj = await client.post_json(self.spec.generate_path, body, self._body_limit(len(ids)))
        what = f"request {i} (prompt {p})"
        routed = self.spec.parse(obj, what)
        return request_rows(self.spec, routed, self.payload_shape, self.dtype, what,
                            prompt_ids=ids, start=0)

    def _body_limit(self, prompt_len: int) -> int:
        """Bytes any honest answer to a request of `prompt_len` tokens stays below: the payload
        of prompt + max_new_tokens rows (8-byte ids, base64), the output ids (a JSON number of
        <= 11 characters each), and 1 MiB for the rest of the envelope."""
        from sempar.capture.payload import NPY_HEADER_MAX, b64_length

        rows = prompt_len + self.s.max_new_tokens
        return b64_length(rows * self.payload_shape.row_values * 8 + NPY_HEADER_MAX) + \
            12 * (rows + 1) + (1 << 20)

    # ---- the run -------------------------------------------------------------------------

    def run(self, out: str | os.PathLike, progress: Callable[[int], Any] | None = None
            ) -> dict[str, Any]:
        from sempar.atomic import release_input
        from sempar.trace.io import iter_blocks

        out = Path(out)
        prev = _previous(out, self.capture)
        done_requests = 0
        self._decode_count = 0
        has_domain = bool(self.prompts.domains)
        names = self.prompts.names
        if any(n is not None for n in names):
            self.capture["prompt_ids"] = [names[i % len(names)] for i in range(self.s.requests)]
        with TraceWriter(out, self.meta, self.prompts.domains if has_domain else None,
                         has_decode=True) as w:
            if prev is not None:                 # copy the requests a previous run captured
                self.capture["prompt_tokens"] = list(prev.extra["capture"]["prompt_tokens"])
                done_requests = len(self.capture["prompt_tokens"])
                lens = np.asarray(self.capture["prompt_tokens"], dtype=np.int64)
                for _, _, _, a in iter_blocks(out, optional=("domain",)):
                    dec = a["position"] >= lens[a["request_id"]]
                    w.write(a["token_id"], a["request_id"], a["position"], a["experts"],
                            a.get("domain"), decode=dec)
                    self._decode_count += int(dec.sum())
                release_input(out)
                if progress is not None:
                    progress(done_requests)
            self._w, self._progress = w, progress
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="capture-writer")
            self._pending: Future | None = None
            self._write_failed = False
            self._buf: list[tuple[int, RequestRows]] = []
            self._buffered = 0
            saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
            self._stopped = None
            try:
                _run_loop(self._main(done_requests))
            except (InputError, Interrupted) as err:
                self._stopped = err
            finally:                     # asyncio leaves SIG_DFL behind, not what was there
                for sig, handler in saved.items():
                    if handler is not None:
                        signal.signal(sig, handler)
            try:
                self._drain()            # a block that failed to write stops here
                self._flush()
                self._drain()
            except InputError as err:
                self._stopped = err
            finally:
                self._writer.shutdown()
            if self._stopped is not None and w.rows == 0:
                self._abort(self._stopped)      # nothing captured: nothing is written
        written = len(self.capture["prompt_tokens"])
        summary = {"out": str(out), "tokens": w.rows, "requests": written,
                   "requests_total": self.s.requests, "resumed_requests": done_requests,
                   "decode_rows": self._decode_count, "layers": self.meta.num_layers,
                   "layer_ids": list(self.meta.layers), "experts": self.meta.num_experts,
                   "top_k": self.meta.top_k, "model": self.meta.model,
                   "engine": self.s.engine, "retries": self.retries}
        summary["prefill_rows"] = summary["tokens"] - summary["decode_rows"]
        err = self._stopped
        if isinstance(err, Interrupted):
            sys.stderr.write(f"interrupted by signal {err.signum}: wrote {out} with {written} of "
                             f"{self.s.requests} requests (a valid trace); run the same command "
                             "again to continue\n")
            raise SystemExit(128 + err.signum)
        if isinstance(err, InputError):
            raise InputError(f"{err} (kept {written} of {self.s.requests} requests in {out}: "
                             "the same command continues)")
        return summary

    async def _main(self, first: int) -> None:
        loop = asyncio.get_running_loop()
        stop: list[int] = []
        self._stop_event = asyncio.Event()

        def on_signal(signum: int) -> None:
            stop.append(signum)
            self._stop_event.set()

        installed = []
        for sig in STOP_SIGNALS:
            try:
                loop.add_signal_handler(sig, on_signal, int(sig))
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        try:
            await self._dispatch(first, stop)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def _dispatch(self, first: int, stop: list[int]) -> None:
        n = self.s.requests
        window = WINDOW_PER_SLOT * self.s.client.concurrency
        results: dict[int, RequestRows] = {}
        tasks: dict[int, asyncio.Task] = {}
        async with EngineClient(self.s.url, self.s.client) as client:
            sem = asyncio.Semaphore(self.s.client.concurrency)

            async def one(i: int) -> None:
                async with sem:
                    results[i] = await self._one(client, i)

            nxt, head = first, first
            stopped = asyncio.ensure_future(self._stop_event.wait())
            try:
                while head < n:
                    while nxt < n and nxt < head + window and not stop:
                        tasks[nxt] = asyncio.create_task(one(nxt))
                        nxt += 1
                    if stop:
                        raise Interrupted(stop[0])
                    task = tasks[head]
                    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
                    if not task.done():
                        continue
                    del tasks[head]
                    task.result()              # a failed request stops the run here
                    self._add(head, results.pop(head))
                    head += 1
            finally:
                stopped.cancel()
                for t in tasks.values():
                    t.cancel()
                await asyncio.gather(*tasks.values(), return_exceptions=True)
                self.retries = client.retries

    def _add(self, i: int, rows: RequestRows) -> None:
        self._buf.append((i, rows))
        self._buffered += rows.position.shape[0]
        if self._progress is not None:
            self._progress(1)
        if self._buffered >= FLUSH_ROWS:
            self._flush()

    def _abort(self, err: Exception) -> None:
        if isinstance(err, Interrupted):
            sys.stderr.write(f"interrupted by signal {err.signum} before any request was "
                             "captured: nothing written\n")
            raise SystemExit(128 + err.signum)
        raise err

    def _drain(self) -> None:
        """Wait for the block being written (its error, if any, raised here; the requests
        buffered after it are then dropped, so the trace stays a prefix)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            try:
                pending.result()
            except BaseException:
                self._write_failed = True
                self._buf.clear()
                raise

    def _write(self, block: tuple, lens: list[int], decode: int) -> None:
        """On the writer thread: write one block, then count its requests as written."""
        self._w.write(*block)
        self.capture["prompt_tokens"].extend(lens)
        self._decode_count += decode

    def _flush(self) -> None:
        """Hand the buffered requests to the writer thread (Parquet encoding and compression
        release the GIL: they overlap the next responses' transfer); one block at a time."""
        if not self._buf or self._write_failed:
            self._buf.clear()
            return
        rows = [r for _, r in self._buf]
        lens = [r.position.shape[0] for r in rows]
        rid = np.repeat(np.asarray([i for i, _ in self._buf], np.int32), lens)
        dom = None
        if self.prompts.domains:
            P = len(self.prompts.ids)
            dom = np.repeat(np.asarray([self.prompts.domain[i % P] for i, _ in self._buf],
                                       np.int16), lens)
        position = np.concatenate([r.position for r in rows])
        is_decode = position >= np.repeat(np.asarray([r.prompt_len for r in rows], np.int64), lens)
        block = (np.concatenate([r.token_id for r in rows]), rid, position,
                 np.concatenate([r.experts for r in rows]), dom, None, is_decode)
        lens = [r.prompt_len for r in rows]
        decode = sum(int((r.position >= r.prompt_len).sum()) for r in rows)
        self._buf.clear()
        self._buffered = 0
        self._drain()
        self._pending = self._writer.submit(self._write, block, lens, decode)
