"""`RoutedRequest`: one routed request of the router, step by step: `parse` (size-limited body,
strict JSON: no NaN / Infinity) -> `tokenize` (bodies over `THREAD_BYTES` parsed, tokenized and
scored in a worker thread, so the event loop, /health included, never waits behind a big prompt)
-> `choose` (the policy's streaming `submit`; `complete` when the answer ends, however it ends)
-> `forward` (the rank in the engine's field or header; the client's disconnect watched until the
upstream's headers arrive, so a client that leaves cancels the engine request and frees its slot
at once) -> `relay` (the answer streamed back chunk by chunk, byte for byte). Refusals and
upstream failures are answered by the router state's one helper each (`app.RouterState`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from sempar.prompt import PromptError
from sempar.router.upstream import UpstreamDown, UpstreamTimeout, forward_headers, is_timeout

log = logging.getLogger("sempar.router")
RESPONSE_DROP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length",
                           "date", "server"})
THREAD_BYTES = 64 << 10     # bodies above this are parsed and tokenized off the event loop


class Refused(Exception):
    """A request refused before it reached the upstream: `response` is what the client gets."""

    def __init__(self, response: Response):
        self.response = response


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON (RFC 8259)")


def parse_body(raw: bytes) -> dict:
    """The body as a JSON object; NaN / Infinity refused (json.loads takes them, and /generate's
    re-serialised body would then reach the engine as invalid JSON)."""
    body = json.loads(raw, parse_constant=_no_constant)
    if not isinstance(body, dict):
        raise ValueError("the body is not a JSON object")
    return body


def relayed_headers(up) -> dict:
    """The upstream's response headers the client gets (hop-by-hop and our server's dropped)."""
    return {k: v for k, v in up.headers.items() if k.lower() not in RESPONSE_DROP}


def _log_end(event: str, rid: int, path: str, g: int, n: int, status, t0: float) -> float:
    dt = time.perf_counter() - t0
    log.info(json.dumps({"event": event, "request": rid, "path": path, "rank": g, "tokens": n,
                         "status": status, "seconds": round(dt, 6)}))
    return dt


async def _disconnected(receive) -> None:
    """Returns when the client has gone (the body is already read: nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Routed(StreamingResponse):
    """A streamed upstream answer that calls `on_end` exactly once, however it ends (done,
    upstream error, client gone before or during the stream). The client's disconnect is
    watched while the stream waits for the upstream, so a gone client cancels the upstream
    request at once, not at the next chunk."""

    def __init__(self, content, on_end, **kw):
        super().__init__(content, **kw)
        self._on_end = on_end

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    await self.stream_response(send)
                    tg.cancel_scope.cancel()

                async def listen() -> None:
                    await self.listen_for_disconnect(receive)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                tg.start_soon(listen)
        except OSError:                             # the client went away mid-send
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
            self._on_end()


class RoutedRequest:
    """One routed request: `parse` -> `tokenize` -> `choose` (a rank) -> `forward` -> `relay`.
    Each step raises `Refused` with the answer when it cannot go on; the rank's slot is held
    from `choose` to the end of the answer and released exactly once (`release`)."""

    def __init__(self, st: RouterState, request: Request):
        self.st, self.request = st, request
        self.route = request.scope["path"].rstrip("/") or "/"   # /v1/completions/ = /v1/completions
        self.rid = next(st.ids)
        self.g, self.n, self._held = -1, 0, False
        self.t0 = 0.0

    async def run(self) -> Response:
        try:
            raw = await self.read_body()
            big = len(raw) > THREAD_BYTES
            if big:                                # parse, tokenize, score rows: off the loop
                body, tokens = await anyio.to_thread.run_sync(self.parse_and_tokenize, raw)
                work = await anyio.to_thread.run_sync(self.st.policy.prepare, tokens)
            else:
                body, tokens = self.parse_and_tokenize(raw)
                work = tokens
            self.choose(work, int(tokens.size))
        except Refused as r:
            return r.response
        try:
            if self.st.routing_log is not None:    # a big prompt's line is built off the loop
                line = (await anyio.to_thread.run_sync(self.log_line, tokens) if big
                        else self.log_line(tokens))
                self.st.routing_log.write(line)
            raw, headers = self.outgoing(raw, body, tokens)
            up = await self.forward(headers, raw)
            return await self.relay(up, bool(body.get("stream")))
        except Refused as r:
            self.release()
            return r.response
        except BaseException:                      # cancelled before a response existed
            self.release()
            raise

    async def read_body(self) -> bytes:
        st, limit = self.st, self.st.cfg.max_body_bytes
        size = self.request.headers.get("content-length")
        too_large = Refused(st.refuse(413, "too_large", f"request body over {limit} bytes")) \
            if size is not None and (not size.isdigit() or int(size) > limit) else None
        if too_large:
            raise too_large
        chunks, total = [], 0
        try:
            async for c in self.request.stream():
                total += len(c)
                if total > limit:
                    raise Refused(st.refuse(413, "too_large", f"request body over {limit} bytes"))
                chunks.append(c)
        except ClientDisconnect:
            raise Refused(st.refuse(499, "client_gone", "client gone")) from None
        return b"".join(chunks)

    def parse_and_tokenize(self, raw: bytes):
        """(body dict, token ids int64[n]); runs in a worker thread for big bodies."""
        try:
            body = parse_body(raw)
        except (ValueError, RecursionError) as err:
            msg = f"invalid JSON body: {str(err).splitlines()[0]}"
            raise Refused(self.st.refuse(400, "bad_json", msg)) from None
        try:
            return body, self.st.tokenizer.tokens(self.route, body)
        except PromptError as err:
            raise Refused(self.st.refuse(400, "no_prompt", str(err))) from None

    def choose(self, work, n: int) -> None:
        """The rank, from the policy's `submit` of the tokens (or their `prepare`d form)."""
        st = self.st
        g = st.acquire(work, n)
        if g is None:
            raise Refused(st.refuse(429, "overloaded",
                                    f"every rank holds {st.cfg.max_inflight_per_rank} requests",
                                    headers={"Retry-After": "1"}))
        self.g, self.n, self._held = g, n, True

    def log_line(self, tokens) -> str:
        """The --log-routing line of this request: {"request", "t", "route", "rank", "tokens"}."""
        return json.dumps({"request": self.rid, "t": round(time.time(), 6), "route": self.route,
                           "rank": self.g, "tokens": tokens.tolist()}) + "\n"

    def release(self) -> None:
        if self._held:
            self._held = False
            self.st.release(self.g, self.n)

    def outgoing(self, raw: bytes, body: dict, tokens) -> tuple[bytes, dict]:
        """The body and headers sent upstream: the rank in /generate's body field (SGLang's
        native route, re-serialised) or in the engine's header (the body byte for byte)."""
        eng = self.st.engine
        if self.route == "/generate":
            body[eng.body_field] = self.g
            raw, extra = json.dumps(body, allow_nan=False).encode(), None
        else:
            extra = {eng.header: str(self.g)}
        return raw, forward_headers(self.request.headers.items(), extra)

    async def forward(self, headers: dict, raw: bytes):
        """The upstream response once its headers arrived. The client's disconnect is watched
        meanwhile (SGLang sends a non-streamed answer's headers only after generating it): a
        client that leaves cancels the upstream request and frees the rank's slot at once."""
        st = self.st
        self.t0 = time.perf_counter()
        opening = asyncio.ensure_future(st.upstream.open("POST", self.route, headers, raw))
        gone = asyncio.ensure_future(_disconnected(self.request.receive))
        try:
            await asyncio.wait((opening, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not opening.done():
                opening.cancel()
        if not opening.done() or opening.cancelled():
            with contextlib.suppress(BaseException):
                await opening                       # the upstream connection is closed
            _log_end("aborted", self.rid, self.route, self.g, self.n, None, self.t0)
            raise Refused(st.refuse(499, "client_gone", "client gone"))
        try:
            up = opening.result()
        except (UpstreamDown, UpstreamTimeout) as err:
            raise Refused(st.upstream_failure(err, self.rid, self.g, self.route)) from None
        st.metrics.first_byte.observe(time.perf_counter() - self.t0)
        return up

    async def relay(self, up, stream: bool) -> Response:
        headers = relayed_headers(up)
        if not stream:
            return await self.whole(up, headers)
        return Routed(self.chunks(up), self.on_stream_end(up), status_code=up.status,
                      headers=headers)

    async def whole(self, up, headers: dict) -> Response:
        """A non-streamed answer: read whole (fewer writes than a stream), the client's
        disconnect watched meanwhile so a gone client still cancels the upstream."""
        st = self.st
        read = asyncio.ensure_future(up.read())
        gone = asyncio.ensure_future(_disconnected(self.request.receive))
        try:
            await asyncio.wait((read, gone), return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                return st.refuse(499, "client_gone", "client gone")
            if read.exception() is not None:     # cut mid-body: nothing sent yet
                return st.upstream_failure(read.exception(), self.rid, self.g, self.route,
                                           " mid-answer")
            return Response(read.result(), status_code=up.status, headers=headers)
        finally:
            for t in (read, gone):
                t.cancel()
            up.close() if not read.done() or read.cancelled() else up.release()
            self.release()
            st.metrics.total.observe(_log_end("done", self.rid, self.route, self.g, self.n,
                                              up.status, self.t0))

    async def chunks(self, up):
        st, self.ok = self.st, False
        try:
            async for c in up.content.iter_any():
                yield c
            self.ok = True
        except Exception as err:           # noqa: BLE001 - the stream is cut: say why in the log
            self.cut, timeout = True, is_timeout(err)
            st.metrics.errors.labels("upstream_timeout" if timeout else "upstream_down").inc()
            log.warning(json.dumps({"event": "upstream_timeout" if timeout else "upstream_cut",
                                    "request": self.rid, "rank": self.g,
                                    "detail": type(err).__name__}))
        finally:
            if not self.ok:                     # client gone or upstream cut: abort upstream
                up.close()
            up.release()
            st.metrics.total.observe(_log_end("done" if self.ok else "aborted", self.rid,
                                              self.route, self.g, self.n, up.status, self.t0))

    def on_stream_end(self, up):
        self.ok = self.cut = False

        def end() -> None:
            if not self.ok:                         # never started or cut: abort the upstream
                up.close()
                if not self.cut:
                    self.st.metrics.errors.labels("client_gone").inc()
            self.release()
        return end
