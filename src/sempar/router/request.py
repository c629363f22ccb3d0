"""`RoutedRequest`: one routed request of the router, a raw ASGI handler (issue 37: no Starlette
request / response objects on the hot path), step by step: `parse` (size-limited body, strict
JSON: no NaN / Infinity) -> `tokenize` (bodies over `THREAD_BYTES` parsed, tokenized and scored
in a worker thread, so the event loop, /health included, never waits behind a big prompt; their
bytes in threads at once bounded, 429 beyond) ->
`choose` (the policy's streaming `submit`; `complete` when the answer ends, however it ends) ->
`forward` (the rank in the engine's field or header; from here to the answer's end one task
watches for the client's disconnect, so a client that leaves cancels the engine request and
frees its slot at once) -> `whole` / `stream` (the answer sent in one message, or streamed
back chunk by chunk, byte for byte). Refusals and upstream failures are answered by the router
state's one helper each (`app.RouterState`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import anyio
from starlette.responses import Response

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


def relayed_raw_headers(up) -> list[tuple[bytes, bytes]]:
    """`relayed_headers` as the ASGI start message's list (repeated headers kept, no decoding)."""
    return [(k.lower(), v) for k, v in up.raw_headers
            if k.decode("latin-1").lower() not in RESPONSE_DROP]


def _log_end(event: str, rid: int, path: str, g: int, n: int, status, t0: float) -> float:
    dt = time.perf_counter() - t0
    log.info(json.dumps({"event": event, "request": rid, "path": path, "rank": g, "tokens": n,
                         "status": status, "seconds": round(dt, 6)}))
    return dt


async def _disconnected(receive) -> None:
    """Returns when the client has gone (the body is already read: nothing else arrives; the
    server also says so once the answer is complete)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class RoutedRequest:
    """One routed request, a raw ASGI handler (no Starlette request / response objects on the
    hot path: issue 37's time-to-first-byte target): `parse` -> `tokenize` -> `choose` (a rank)
    -> `forward` -> `relay`. Each step before the answer begins raises `Refused` with the answer
    when it cannot go on; the rank's slot is held from `choose` to the end of the answer and
    released exactly once (`release`).

    From `forward` on, one watcher task waits for the client's disconnect and cancels this
    request's task when it comes (`_watch`), so a gone client aborts the upstream request at
    once wherever the request waits (the upstream's headers, a non-streamed body, the next
    chunk of a stream), with one task per request rather than one per step."""

    def __init__(self, st: RouterState, scope, receive, send):
        self.st, self.scope, self.receive, self._send = st, scope, receive, send
        self.route = scope["path"].rstrip("/") or "/"   # /v1/completions/ = /v1/completions
        self.rid = next(st.ids)
        self.g, self.n, self._held = -1, 0, False
        self.t0 = 0.0
        self.started = False                      # the answer's start message went out
        self._watcher: asyncio.Task | None = None
        self._gone = False                        # the watcher saw the client leave

    def header(self, name: bytes) -> str | None:
        for k, v in self.scope["headers"]:
            if k == name:
                return v.decode("latin-1")
        return None

    def header_items(self) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.scope["headers"]]

    async def send(self, message) -> None:
        self.started = True
        await self._send(message)

    async def answer(self, response: Response) -> None:
        """A refusal or failure answer (a Starlette response: not the hot path)."""
        if not self.started:
            await response(self.scope, self.receive, self.send)

    async def run(self) -> None:
        st = self.st
        try:
            if not st.authorized(self.header(b"authorization") or ""):
                raise Refused(st.refuse(401, "unauthorized", "missing or wrong API key"))
            raw = await self.read_body()
            big = len(raw) > THREAD_BYTES
            if big:                                # parse, tokenize, score rows: off the loop
                body, tokens, work = await self.tokenize_big(raw)
            else:
                body, tokens = self.parse_and_tokenize(raw)
                work = tokens
            self.choose(work, int(tokens.size))
        except Refused as r:
            return await self.answer(r.response)
        try:
            if self.st.routing_log is not None:    # a big prompt's line is built off the loop
                line = (await anyio.to_thread.run_sync(self.log_line, tokens) if big
                        else self.log_line(tokens))
                self.st.routing_log.write(line)
            raw, headers = self.outgoing(raw, body, tokens)
            self._watch()
            up = await self.forward(headers, raw)
            if body.get("stream"):
                await self.stream(up)
            else:
                await self.whole(up)
        except Refused as r:
            self.release()
            await self.answer(r.response)
        except asyncio.CancelledError:
            self.release()
            if not self._gone:                     # the server's own cancel (shutdown): on
                raise
            asyncio.current_task().uncancel()      # ours: the client left, nothing to answer
        except BaseException:
            self.release()
            raise
        finally:
            self._unwatch()

    def _watch(self) -> None:
        task = asyncio.current_task()

        def gone(w: asyncio.Task) -> None:
            if self._watcher is w and not w.cancelled():
                self._gone = True
                task.cancel()
        self._watcher = asyncio.ensure_future(_disconnected(self.receive))
        self._watcher.add_done_callback(gone)

    def _unwatch(self) -> None:
        """Stop watching (before the answer's last message: the server then reports a
        disconnect that is only the answer's end)."""
        w, self._watcher = self._watcher, None
        if w is not None:
            w.cancel()

    async def read_body(self) -> bytes:
        st, limit = self.st, self.st.cfg.max_body_bytes
        size = self.header(b"content-length")
        if size is not None and (not size.isdigit() or int(size) > limit):
            raise Refused(st.refuse(413, "too_large", f"request body over {limit} bytes"))
        chunks, total = [], 0
        while True:
            m = await self.receive()
            if m["type"] == "http.disconnect":
                raise Refused(st.refuse(499, "client_gone", "client gone"))
            c = m.get("body", b"")
            total += len(c)
            if total > limit:
                raise Refused(st.refuse(413, "too_large", f"request body over {limit} bytes"))
            chunks.append(c)
            if not m.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def tokenize_big(self, raw: bytes):
        """(body, tokens, the policy's prepared form) of a big body, in worker threads, within
        the router's tokenizing byte bound (`RouterState.admit_big`): 429 + Retry-After beyond."""
        st, n = self.st, len(raw)
        if not st.admit_big(n):
            raise Refused(st.refuse(429, "tokenizer_busy",
                                    f"big prompts of {st.tokenizing} bytes are being tokenized "
                                    f"(bound {st.cfg.tokenize_bytes})",
                                    headers={"Retry-After": "1"}))
        try:
            body, tokens = await anyio.to_thread.run_sync(self.parse_and_tokenize, raw)
            return body, tokens, await anyio.to_thread.run_sync(st.policy.prepare, tokens)
        finally:
            st.done_big(n)

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
        return raw, forward_headers(self.header_items(), extra)

    async def forward(self, headers: dict, raw: bytes):
        """The upstream response once its headers arrived (SGLang sends a non-streamed answer's
        headers only after generating it; a client that leaves meanwhile cancels this wait, and
        with it the upstream request)."""
        st = self.st
        self.t0 = time.perf_counter()
        try:
            up = await st.upstream.open("POST", self.route, headers, raw)
        except (UpstreamDown, UpstreamTimeout) as err:
            raise Refused(st.upstream_failure(err, self.rid, self.g, self.route)) from None
        except asyncio.CancelledError:
            if self._gone:
                st.refuse(499, "client_gone", "client gone")   # counted and logged
                _log_end("aborted", self.rid, self.route, self.g, self.n, None, self.t0)
            raise
        st.metrics.first_byte.observe(time.perf_counter() - self.t0)
        return up

    async def whole(self, up) -> None:
        """A non-streamed answer: read whole (fewer writes than a stream), then sent in one
        message; the slot is released before it goes and the log line written after."""
        st, done = self.st, False
        try:
            try:
                data = await up.read()
            except asyncio.CancelledError:
                if self._gone:
                    st.refuse(499, "client_gone", "client gone")
                raise
            except Exception as err:                # noqa: BLE001 - cut mid-body: nothing sent yet
                raise Refused(st.upstream_failure(err, self.rid, self.g, self.route,
                                                  " mid-answer")) from None
            done = True
        finally:
            up.release() if done else up.close()
        self._unwatch()
        self.release()
        headers = relayed_raw_headers(up)
        headers.append((b"content-length", str(len(data)).encode()))
        await self.send({"type": "http.response.start", "status": up.status, "headers": headers})
        await self.send({"type": "http.response.body", "body": data})
        st.metrics.total.observe(_log_end("done", self.rid, self.route, self.g, self.n,
                                          up.status, self.t0))

    async def stream(self, up) -> None:
        """A streamed answer, relayed chunk by chunk as it arrives (byte for byte). However it
        ends (done, upstream cut or timed out, client gone) the upstream is released or
        aborted, the slot released and one log line written."""
        st, ok, cut = self.st, False, False
        try:
            await self.send({"type": "http.response.start", "status": up.status,
                             "headers": relayed_raw_headers(up)})
            pieces = up.content.iter_any()
            while True:
                try:
                    c = await pieces.__anext__()
                except StopAsyncIteration:
                    ok = True
                    break
                except Exception as err:   # noqa: BLE001 - the stream is cut: say why in the log
                    cut, timeout = True, is_timeout(err)
                    st.metrics.errors.labels("upstream_timeout" if timeout else "upstream_down").inc()
                    log.warning(json.dumps({"event": "upstream_timeout" if timeout
                                            else "upstream_cut", "request": self.rid,
                                            "rank": self.g, "detail": type(err).__name__}))
                    break
                await self.send({"type": "http.response.body", "body": c, "more_body": True})
            self._unwatch()
            await self.send({"type": "http.response.body", "body": b""})
        except OSError:                             # the client went away mid-send
            pass
        finally:
            if not ok:                              # never finished: abort the upstream
                up.close()
                if not cut:
                    st.metrics.errors.labels("client_gone").inc()
            up.release()
            self.release()
            st.metrics.total.observe(_log_end("done" if ok else "aborted", self.rid, self.route,
                                              self.g, self.n, up.status, self.t0))
