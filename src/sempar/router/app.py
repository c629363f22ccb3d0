"""`build_app`: the router's ASGI app (Starlette).

Routes: POST /v1/chat/completions, /v1/completions (and /generate when the engine has it) are
routed: body read (size-limited) and parsed as JSON, prompt tokenized, rank chosen by the
policy's streaming form (`submit`; `complete` when the response ends, however it ends), the
request forwarded with the rank in the engine's field or header, the answer streamed back chunk
by chunk, byte for byte. GET /v1/models is forwarded as is; GET /health and /metrics are the
router's own. Errors are OpenAI-style JSON objects on one line: 400 bad JSON or prompt, 401
without the --api-key, 404 unknown route, 413 body too large, 429 every rank at its in-flight
bound (Retry-After), 502 upstream down, 504 upstream timeout. Logs are JSON lines that never
carry headers or prompt text.
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import logging
import time

import asyncio

import anyio
from starlette.applications import Starlette
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


def error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    """An OpenAI-style error body: {"error": {"message", "type", "code"}} (one line), logged
    (the message names no header and carries no prompt text)."""
    log.info(json.dumps({"event": "refused", "status": status, "kind": kind}))
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}},
                        status_code=status, headers=headers)


class RouterState:
    """What one router holds: the policy's in-flight counters (no other state), the metrics,
    the upstream session and the routing log."""

    def __init__(self, cfg: RouterConfig, policy, tokenizer: PromptTokenizer):
        self.cfg, self.policy, self.tokenizer = cfg, policy, tokenizer
        self.engine = ENGINES.get(cfg.engine)
        self.metrics = RouterMetrics(cfg.dp_size)
        self.inflight = [0] * cfg.dp_size           # requests per rank (the --max-inflight bound)
        self.upstream = Upstream(cfg.upstream, cfg.connect_timeout_s, cfg.read_timeout_s)
        self.ids = itertools.count()
        self.routing_log = None

    def acquire(self, tokens) -> int | None:
        """The rank for a request of `tokens` (int64[n]), its counters raised; None when every
        rank is at its in-flight bound."""
        N = self.cfg.max_inflight_per_rank
        allowed = [c < N for c in self.inflight]
        if not any(allowed):
            return None
        g = self.policy.submit(tokens, allowed)
        self.inflight[g] += 1
        n = int(tokens.size)
        req, infl_req, infl_tok = self.metrics.by_rank[g]
        req.inc()
        infl_req.inc()
        infl_tok.inc(n)
        row = self.policy.last_row
        if row:
            tot = sum(row)
            if tot > 0:
                self.metrics.local_share.observe(row[g] / tot)
        return g

    def release(self, g: int, n: int) -> None:
        self.inflight[g] -= 1
        self.policy.complete(g, n)
        _, infl_req, infl_tok = self.metrics.by_rank[g]
        infl_req.dec()
        infl_tok.dec(n)


async def _disconnected(receive) -> None:
    """Returns when the client has gone (the body is already read: nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Routed(StreamingResponse):
    """A streamed upstream answer that calls `on_end` exactly once, however it ends (done,
    upstream error, client gone before or during the stream). The client's disconnect is
    watched while the stream waits for the upstream, whatever ASGI version the server speaks,
    so a gone client cancels the upstream request at once, not at the next chunk."""

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


def build_app(cfg: RouterConfig, policy, tokenizer: PromptTokenizer) -> Starlette:
    """The ASGI app; `app.state.router` is its `RouterState`."""
    st = RouterState(cfg, policy, tokenizer)

    def authorized(request: Request) -> bool:
        if cfg.api_key is None:
            return True
        got = request.headers.get("authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {cfg.api_key}".encode())

    async def read_body(request: Request) -> bytes | Response:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > cfg.max_body_bytes):
            st.metrics.errors.labels("too_large").inc()
            return error(413, f"request body over {cfg.max_body_bytes} bytes", "too_large")
        chunks, total = [], 0
        async for c in request.stream():
            total += len(c)
            if total > cfg.max_body_bytes:
                st.metrics.errors.labels("too_large").inc()
                return error(413, f"request body over {cfg.max_body_bytes} bytes", "too_large")
            chunks.append(c)
        return b"".join(chunks)

    async def routed(request: Request) -> Response:
        if not authorized(request):
            st.metrics.errors.labels("unauthorized").inc()
            return error(401, "missing or wrong API key", "unauthorized")
        try:
            raw = await read_body(request)
        except ClientDisconnect:
            st.metrics.errors.labels("client_gone").inc()
            return Response(status_code=499)
        if isinstance(raw, Response):
            return raw
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except (ValueError, RecursionError) as err:
            st.metrics.errors.labels("bad_json").inc()
            return error(400, f"invalid JSON body: {str(err).splitlines()[0]}", "bad_json")
        route = request.scope["path"]                # what the route matched (no URL object)
        try:
            tokens = st.tokenizer.tokens(route, body)
        except PromptError as err:
            st.metrics.errors.labels("no_prompt").inc()
            return error(400, str(err), "no_prompt")
        g = st.acquire(tokens)
        if g is None:
            st.metrics.errors.labels("overloaded").inc()
            return error(429, f"every rank holds {cfg.max_inflight_per_rank} requests",
                         "overloaded", headers={"Retry-After": "1"})
        n, rid = int(tokens.size), next(st.ids)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                st.release(g, n)

        if st.routing_log is not None:
            st.routing_log.write(json.dumps({"request": rid, "t": round(time.time(), 6),
                                             "route": route, "rank": g,
                                             "tokens": tokens.tolist()}) + "\n")
        if route == "/generate":                   # SGLang's native route: the body field
            body[st.engine.body_field] = g
            raw, extra = json.dumps(body).encode(), None
        else:
            extra = {st.engine.header: str(g)}
        headers = forward_headers(request.headers.items(), extra)
        try:
            return await relay(request, route, headers, raw, rid, g, n, release,
                               bool(body.get("stream")))
        except BaseException:                      # cancelled before a response existed
            release()
            raise

    async def whole(request, up, out_headers, rid, g, n, t0, path, release) -> Response:
        """A non-streamed answer: read whole (fewer writes than a stream), the client's
        disconnect watched meanwhile so a gone client still cancels the upstream."""
        read = asyncio.ensure_future(up.read())
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait((read, gone), return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                st.metrics.errors.labels("client_gone").inc()
                return Response(status_code=499)
            try:
                data = read.result()
            except Exception as err:            # noqa: BLE001 - cut mid-body: nothing sent yet
                timeout = isinstance(err, TimeoutError)
                kind = "upstream_timeout" if timeout else "upstream_down"
                st.metrics.errors.labels(kind).inc()
                return error(504 if timeout else 502, f"upstream {kind.split('_')[1]} mid-answer",
                             kind)
        finally:
            for t in (read, gone):
                t.cancel()
            up.close() if not read.done() or read.cancelled() else up.release()
            release()
            dt = time.perf_counter() - t0
            st.metrics.total.observe(dt)
            log.info(json.dumps({"event": "done", "request": rid, "path": path, "rank": g,
                                 "tokens": n, "status": up.status, "seconds": round(dt, 6)}))
        return Response(data, status_code=up.status, headers=out_headers)

    async def relay(request, path, headers, raw, rid, g, n, release, stream=True) -> Response:
        t0 = time.perf_counter()
        try:
            up = await st.upstream.open(request.method, path, headers, raw)
        except (UpstreamDown, UpstreamTimeout) as err:
            release()
            timeout = isinstance(err, UpstreamTimeout)
            kind = "upstream_timeout" if timeout else "upstream_down"
            st.metrics.errors.labels(kind).inc()
            log.warning(json.dumps({"event": kind, "request": rid, "rank": g, "path": path}))
            return error(504 if timeout else 502, f"upstream {'timed out' if timeout else 'unreachable'}"
                         f": {str(err).splitlines()[0]}", kind)
        st.metrics.first_byte.observe(time.perf_counter() - t0)
        out_headers = {k: v for k, v in up.headers.items() if k.lower() not in RESPONSE_DROP}
        if not stream:
            return await whole(request, up, out_headers, rid, g, n, t0, path, release)

        ok = cut = False

        def on_end() -> None:
            if not ok:                              # never started or cut: abort the upstream
                up.close()
                if not cut:
                    st.metrics.errors.labels("client_gone").inc()
            release()

        async def chunks():
            nonlocal ok, cut
            try:
                async for c in up.content.iter_any():
                    yield c
                ok = True
            except (TimeoutError, UpstreamTimeout) as err:
                cut = True
                st.metrics.errors.labels("upstream_timeout").inc()
                log.warning(json.dumps({"event": "upstream_timeout", "request": rid, "rank": g,
                                        "detail": str(err)[:80]}))
            except Exception as err:           # noqa: BLE001 - the stream is cut, say why in the log
                cut = True
                st.metrics.errors.labels("upstream_down").inc()
                log.warning(json.dumps({"event": "upstream_cut", "request": rid, "rank": g,
                                        "detail": type(err).__name__}))
            finally:
                if not ok:                      # client gone or upstream cut: abort upstream
                    up.close()
                up.release()
                dt = time.perf_counter() - t0
                st.metrics.total.observe(dt)
                log.info(json.dumps({"event": "done" if ok else "aborted", "request": rid,
                                     "path": path, "rank": g, "tokens": n,
                                     "status": up.status, "seconds": round(dt, 6)}))

        return Routed(chunks(), on_end, status_code=up.status, headers=out_headers)

    async def models(request: Request) -> Response:
        if not authorized(request):
            st.metrics.errors.labels("unauthorized").inc()
            return error(401, "missing or wrong API key", "unauthorized")
        try:
            up = await st.upstream.open("GET", "/v1/models",
                                        forward_headers(request.headers.items()), None)
        except (UpstreamDown, UpstreamTimeout) as err:
            timeout = isinstance(err, UpstreamTimeout)
            st.metrics.errors.labels("upstream_timeout" if timeout else "upstream_down").inc()
            return error(504 if timeout else 502, "upstream unreachable", "upstream_down")
        async with up:
            data = await up.read()
        return Response(data, status_code=up.status,
                        headers={k: v for k, v in up.headers.items() if k.lower() not in RESPONSE_DROP})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "engine": cfg.engine, "dp_size": cfg.dp_size,
                             "policy": cfg.policy, "inflight_requests": st.inflight,
                             "inflight_tokens": st.policy.queued})

    async def metrics(request: Request) -> Response:
        return Response(st.metrics.render(), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc) -> Response:
        st.metrics.errors.labels("not_found").inc()
        code = getattr(exc, "status_code", 404)
        return error(code, f"{request.method} {request.url.path}: no such route", "not_found")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await st.upstream.start()
        if cfg.log_routing is not None:
            st.routing_log = open(cfg.log_routing, "a", buffering=1)   # line-buffered: a crash loses no line
        try:
            yield
        finally:
            log.info(json.dumps({"event": "stop", "inflight_requests": st.inflight}))
            await st.upstream.close()
            if st.routing_log is not None:
                st.routing_log.close()

    routes = [Route(r, routed, methods=["POST"]) for r in st.engine.routes]
    routes += [Route("/v1/models", models, methods=["GET"]),
               Route("/health", health, methods=["GET"]),
               Route("/metrics", metrics, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: not_found})
    app.state.router = st
    return app
