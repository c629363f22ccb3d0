"""Test fixtures for `sempar router`: a stand-in engine upstream and a loopback server runner.

`FakeEngine` is NOT an engine: it is a small Starlette app that records every request it
receives (method, path, headers, raw body) and answers in a way the test picks through its
`mode` attribute:

- "ok": a JSON completion; with `"stream": true` in the body, `chunks` server-sent events, each
  sent after the test sets `go` (so a test can see chunk 1 arrive before chunk 2 exists);
- "slow": sleeps `delay` seconds before answering (timeouts);
- "hang": sends one event, then waits (bounded by `delay`) and records whether it was cancelled
  (`cancelled` is set when the router drops the connection).

`serve_in_thread(app)` runs any ASGI app under uvicorn on 127.0.0.1, on a free port, in a
daemon thread, and returns (base URL, stop function). Everything is loopback and bounded.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def sse_events(n: int) -> list[bytes]:
    """The exact bytes of the fixture's n stream events plus the [DONE] line."""
    out = [("data: " + json.dumps({"id": "cmpl-1", "object": "chat.completion.chunk",
                                   "choices": [{"index": 0, "delta": {"content": f"t{i} é"}}]})
            + "\n\n").encode() for i in range(n)]
    return out + [b"data: [DONE]\n\n"]


class FakeEngine:
    """Records requests; answers per `mode` (module docstring)."""

    def __init__(self, chunks: int = 3, delay: float = 2.0, gated: bool = False):
        self.received: list[dict] = []
        self.mode, self.chunks, self.delay, self.gated = "ok", chunks, delay, gated
        self.go: asyncio.Event | None = None
        self.cancelled = threading.Event()
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self.answer, methods=["POST"]),
            Route("/v1/completions", self.answer, methods=["POST"]),
            Route("/generate", self.answer, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"])])

    async def models(self, request: Request) -> Response:
        self.received.append({"method": "GET", "path": "/v1/models",
                              "headers": dict(request.headers), "body": b""})
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def answer(self, request: Request) -> Response:
        raw = await request.body()
        self.received.append({"method": request.method, "path": request.url.path,
                              "headers": dict(request.headers), "body": raw})
        if self.go is None:
            self.go = asyncio.Event()
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        body = json.loads(raw)
        if self.mode == "hang":
            return StreamingResponse(self._hang(), media_type="text/event-stream")
        if body.get("stream"):
            return StreamingResponse(self._stream(), media_type="text/event-stream",
                                     headers={"X-Fake": "1"})
        return JSONResponse({"id": "cmpl-1", "object": "text_completion",
                             "choices": [{"index": 0, "text": "ok"}]}, headers={"X-Fake": "1"})

    async def _stream(self):
        for i, ev in enumerate(sse_events(self.chunks)):
            if self.gated and i == 1:
                await asyncio.wait_for(self.go.wait(), 5.0)
            yield ev

    async def _hang(self):
        try:
            yield sse_events(1)[0]
            await asyncio.sleep(self.delay)
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_in_thread(app, port: int | None = None, graceful_s: float = 5.0):
    """(base URL, stop): `app` served by uvicorn on 127.0.0.1 in a daemon thread."""
    port = port or free_port()
    cfg = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                         access_log=False, lifespan="on", timeout_graceful_shutdown=graceful_s)
    server = uvicorn.Server(cfg)
    server.install_signal_handlers = lambda: None      # not the main thread
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    t0 = time.monotonic()
    while not server.started:
        if time.monotonic() - t0 > 10 or not th.is_alive():
            raise RuntimeError("the loopback server did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        th.join(10)

    return f"http://127.0.0.1:{port}", stop
