"""`build_app`: the router's ASGI app, its request path as one small class.

Routes: POST /v1/chat/completions, /v1/completions (and /generate when the engine has it), with
or without a trailing slash, are routed by `request.RoutedRequest`, a raw ASGI handler that
`RouterApp` calls before any Starlette machinery (issue 37: the router adds <= 1 ms to the time
to first byte); the rest is a small Starlette app. The routed request: parse (size-limited body, strict
JSON: no NaN / Infinity) -> tokenize (bodies over `THREAD_BYTES` in a worker thread, so the event
loop, /health included, never waits behind a big prompt) -> choose rank (the policy's streaming
form, `submit`; `complete` when the answer ends, however it ends) -> forward (the rank in the
engine's field or header, the client's disconnect watched by one task until the answer ends, so
a client that leaves cancels the engine request and frees the slot at once) -> relay (the
answer streamed back chunk by chunk, byte for byte). GET /v1/models is forwarded as is; GET
/health and /metrics are the router's own. With --api-key every route, these two included, needs
it (`authorized`, the one check). Errors are OpenAI-style JSON objects on one line, from one
helper (`refuse`) and one for upstream failures (`upstream_failure`: 502 refused / dropped,
504 timed out): 400 bad JSON or prompt, 401 without the key, 404 unknown route, 413 body too
large, 429 every rank at its in-flight bound or the big prompts being tokenized at their byte
bound (`RouterState.admit_big`; Retry-After). Logs are JSON lines that never carry headers or
prompt text.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sempar.router.config import RouterConfig
from sempar.router.engines import ENGINES
from sempar.router.metrics import RouterMetrics
from sempar.prompt import PromptTokenizer
from sempar.router.request import RoutedRequest, relayed_headers
from sempar.router.upstream import Upstream, forward_headers, is_timeout

log = logging.getLogger("sempar.router")


class CancelledAnswer:
    """ASGI middleware: a request the server cancels (its graceful-shutdown timeout passed) ends
    with a one-line 503 JSON answer when nothing was sent yet, or with its stream cut when the
    answer had begun; never uvicorn's plain-text 500 and a traceback."""

    def __init__(self, app):
        self.app = app
        self.state = getattr(app, "state", None)

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
        self.tokenizing = 0       # bytes of big bodies in worker threads now (`admit_big`)
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

    def authorized(self, authorization: str) -> bool:
        """With --api-key: `Authorization: Bearer KEY` (the header's value given), the scheme
        in any case (RFC 7235)."""
        if self._key is None:
            return True
        scheme, _, token = authorization.strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._key)

    def admit_big(self, n: int) -> bool:
        """Whether a big body of n bytes may be parsed and tokenized now: the bytes in worker
        threads stay within `cfg.tokenize_bytes` (one body always goes), so the tokenizers'
        memory is bounded however many big prompts arrive; the caller answers 429 when not and
        calls `done_big(n)` when its work ends. (Event-loop only: no lock needed.)"""
        if self.tokenizing and self.tokenizing + n > self.cfg.tokenize_bytes:
            return False
        self.tokenizing += n
        return True

    def done_big(self, n: int) -> None:
        self.tokenizing -= n

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


def build_app(cfg: RouterConfig, policy, tokenizer: PromptTokenizer):
    """The ASGI app (`CancelledAnswer` around `RouterApp`); `app.state.router` is its
    `RouterState`."""
    st = RouterState(cfg, policy, tokenizer)

    def guarded(handler):
        async def endpoint(request: Request) -> Response:
            if not st.authorized(request.headers.get("authorization", "")):
                return st.refuse(401, "unauthorized", "missing or wrong API key")
            return await handler(request)
        return endpoint

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

    async def unreachable(request: Request) -> Response:
        raise AssertionError("RouterApp answers POST on the routed paths")

    # The routed paths, POST only: RouterApp takes every POST on them before Starlette, so these
    # routes only give the other methods their 405 refusal.
    hot = frozenset(r + tail for r in st.engine.routes for tail in ("", "/"))
    routes = [Route(p, unreachable, methods=["POST"]) for p in sorted(hot)]
    routes += [Route("/v1/models", guarded(models), methods=["GET"]),
               Route("/health", guarded(health), methods=["GET"]),
               Route("/metrics", guarded(metrics), methods=["GET"])]
    rest = Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: not_found})
    rest.router.redirect_slashes = False
    rest.state.router = st
    return CancelledAnswer(RouterApp(st, hot, rest))


class RouterApp:
    """The router's ASGI app: POST on a routed path goes straight to `RoutedRequest` (a raw
    ASGI handler: issue 37's time to first byte), everything else (the lifespan, /health,
    /metrics, /v1/models, 404 / 405) to the Starlette app `rest`. `state.router` is the
    `RouterState`. An unexpected error before the answer begins is a one-line JSON 500."""

    def __init__(self, st: RouterState, hot: frozenset[str], rest: Starlette):
        self.st, self.hot, self.rest = st, hot, rest
        self.state = rest.state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.hot:
            return await self.rest(scope, receive, send)
        req = RoutedRequest(self.st, scope, receive, send)
        try:
            await req.run()
        except Exception as err:                   # noqa: BLE001 - a defect: say so in JSON
            log.exception(json.dumps({"event": "internal_error", "request": req.rid,
                                      "detail": type(err).__name__}))
            if not req.started:
                await self.st.refuse(500, "internal_error", "internal router error")(
                    scope, receive, send)
