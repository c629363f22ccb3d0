"""`build_app`: the router's ASGI app (Starlette), its request path as one small class.

Routes: POST /v1/chat/completions, /v1/completions (and /generate when the engine has it), with
or without a trailing slash, are routed by `RoutedRequest`: parse (size-limited body, strict
JSON: no NaN / Infinity) -> tokenize (bodies over `THREAD_BYTES` in a worker thread, so the event
loop, /health included, never waits behind a big prompt) -> choose rank (the policy's streaming
form, `submit`; `complete` when the answer ends, however it ends) -> forward (the rank in the
engine's field or header, the client's disconnect watched until the upstream's headers arrive,
so a client that leaves cancels the engine request and frees the slot at once) -> relay (the
answer streamed back chunk by chunk, byte for byte). GET /v1/models is forwarded as is; GET
/health and /metrics are the router's own. With --api-key every route, these two included, needs
it (`authorized`, the one check). Errors are OpenAI-style JSON objects on one line, from one
helper (`refuse`) and one for upstream failures (`upstream_failure`: 502 refused / dropped,
504 timed out): 400 bad JSON or prompt, 401 without the key, 404 unknown route, 413 body too
large, 429 every rank at its in-flight bound (Retry-After). Logs are JSON lines that never carry
headers or prompt text.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import time

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sempar.router.config import RouterConfig
from sempar.router.engines import ENGINES
from sempar.router.metrics import RouterMetrics
from sempar.router.prompt import PromptError, PromptTokenizer
from sempar.router.upstream import Upstream, UpstreamDown, UpstreamTimeout, forward_headers

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


def is_timeout(err: BaseException) -> bool:
    """Whether an upstream failure is a timeout (504) rather than a refused / dropped
    connection (502); aiohttp's read timeouts are TimeoutErrors."""
    return isinstance(err, (UpstreamTimeout, TimeoutError))


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


class CancelledAnswer:
    """ASGI middleware: a request the server cancels (its graceful-shutdown timeout passed) ends
    with a one-line 503 JSON answer when nothing was sent yet, or with its stream cut when the
    answer had begun; never uvicorn's plain-text 500 and a traceback."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            log.warning(json.dumps({"event": "cancelled_at_shutdown", "path": scope.get("path"),
                                    "answer_begun": started}))
            if not started:
                body = json.dumps({"error": {"message": "the router is shutting down",
                                             "type": "shutting_down", "code": 503}}).encode()
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})


class RouterState:
    """What one router holds: the policy's in-flight counters (no other state), the metrics,
    the upstream session and the routing log; the refusal and upstream-failure answers."""

    def __init__(self, cfg: RouterConfig, policy, tokenizer: PromptTokenizer):
        self.cfg, self.policy, self.tokenizer = cfg, policy, tokenizer
        self.engine = ENGINES.get(cfg.engine)
        self.metrics = RouterMetrics(cfg.dp_size)
        self.inflight = [0] * cfg.dp_size           # requests per rank (the --max-inflight bound)
        self.upstream = Upstream(cfg.upstream, cfg.connect_timeout_s, cfg.read_timeout_s)
        self.ids = itertools.count()
        self.routing_log = None
        self._key = f"{cfg.api_key}".encode() if cfg.api_key is not None else None

    def refuse(self, status: int, kind: str, message: str,
               headers: dict | None = None) -> JSONResponse:
        """The one refusal: an OpenAI-style error body {"error": {"message", "type", "code"}}
        on one line, counted and logged (the message names no header, carries no prompt)."""
        if status != 499:
            log.info(json.dumps({"event": "refused", "status": status, "kind": kind}))
        self.metrics.errors.labels(kind).inc()
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}},
                            status_code=status, headers=headers)

    def upstream_failure(self, err: BaseException, rid: int | None = None, g: int | None = None,
                         path: str = "", stage: str = "") -> JSONResponse:
        """The one answer to an upstream failure before anything reached the client: 504 when
        it timed out, 502 when it refused or dropped the connection."""
        timeout = is_timeout(err)
        kind = "upstream_timeout" if timeout else "upstream_down"
        log.warning(json.dumps({"event": kind, "request": rid, "rank": g, "path": path}))
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        return self.refuse(504 if timeout else 502, kind,
                           f"upstream {'timed out' if timeout else 'unreachable'}{stage}: {detail}")

    def authorized(self, request: Request) -> bool:
        """With --api-key: `Authorization: Bearer KEY`, the scheme in any case (RFC 7235)."""
        if self._key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._key)

    def acquire(self, tokens, n: int) -> int | None:
        """The rank for a request of n tokens (int64[n], or the policy's `prepare`d form), its
        counters raised; None when every rank is at its in-flight bound."""
        N = self.cfg.max_inflight_per_rank
        allowed = [c < N for c in self.inflight]
        if not any(allowed):
            return None
        g = self.policy.submit(tokens, allowed)
        self.inflight[g] += 1
        req, infl_req, infl_tok = self.metrics.by_rank[g]
        req.inc()
        infl_req.inc()
        infl_tok.inc(n)
        row = self.policy.last_row
        if row and sum(row) > 0:
            self.metrics.local_share.observe(row[g] / sum(row))
        return g

    def release(self, g: int, n: int) -> None:
        self.inflight[g] -= 1
        self.policy.complete(g, n)
        _, infl_req, infl_tok = self.metrics.by_rank[g]
        infl_req.dec()
        infl_tok.dec(n)


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


def build_app(cfg: RouterConfig, policy, tokenizer: PromptTokenizer) -> Starlette:
    """The ASGI app; `app.state.router` is its `RouterState`."""
    st = RouterState(cfg, policy, tokenizer)

    def guarded(handler):
        async def endpoint(request: Request) -> Response:
            if not st.authorized(request):
                return st.refuse(401, "unauthorized", "missing or wrong API key")
            return await handler(request)
        return endpoint

    async def routed(request: Request) -> Response:
        return await RoutedRequest(st, request).run()

    async def models(request: Request) -> Response:
        try:
            up = await st.upstream.open("GET", "/v1/models",
                                        forward_headers(request.headers.items()), None)
            async with up:
                data = await up.read()
        except Exception as err:                   # noqa: BLE001 - refused, dropped, timed out
            return st.upstream_failure(err, path="/v1/models")
        return Response(data, status_code=up.status, headers=relayed_headers(up))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "engine": cfg.engine, "dp_size": cfg.dp_size,
                             "policy": cfg.policy, "inflight_requests": st.inflight,
                             "inflight_tokens": st.policy.queued})

    async def metrics(request: Request) -> Response:
        return Response(st.metrics.render(), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc) -> Response:
        code = getattr(exc, "status_code", 404)
        return st.refuse(code, "not_found", f"{request.method} {request.url.path}: no such route")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await st.upstream.start()
        if cfg.log_routing is not None:
            # line-buffered: a crash loses no line
            st.routing_log = open(cfg.log_routing, "a", buffering=1)
        try:
            yield
        finally:
            log.info(json.dumps({"event": "stop", "inflight_requests": st.inflight}))
            await st.upstream.close()
            if st.routing_log is not None:
                st.routing_log.close()

    routes = [Route(r + tail, guarded(routed), methods=["POST"])
              for r in st.engine.routes for tail in ("", "/")]
    routes += [Route("/v1/models", guarded(models), methods=["GET"]),
               Route("/health", guarded(health), methods=["GET"]),
               Route("/metrics", guarded(metrics), methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(CancelledAnswer)],
                    exception_handlers={404: not_found, 405: not_found})
    app.router.redirect_slashes = False
    app.state.router = st
    return app
