"""The HTTP client `sempar capture` talks to an engine with: one pooled aiohttp session (keep-alive
connections, as many as requests in flight), a per-request timeout, and retries with exponential
backoff on transient failures (connect / read errors, timeouts, HTTP 429 and 5xx).

aiohttp rather than httpx: fetching 1,000 SGLang responses of 512 routed tokens of
DeepSeek-V2-Lite's shape (432 KiB each) from the loopback replay server, 32 in flight, took httpx
0.28.1 12.6-13.0 s wall and 3.6 s of CPU, aiohttp 3.14 1.7-2.1 s and 0.3-0.5 s (2 loaded cores,
uvloop both): httpcore's pool bookkeeping and h11's parsing run per chunk in Python, so httpx
alone would miss `benchmarks/bench_capture.py`'s 60 s for 10,000 requests.

A failure that retrying cannot fix is `InputError` naming the URL and the cause: the server
unreachable after every try, or a 4xx answer (its error message quoted).
"""

from __future__ import annotations

import asyncio
import random

import orjson
from dataclasses import dataclass
from typing import Any

from sempar.errors import InputError

# Response bodies far above the largest payload a real request returns (a 128k-token request of
# DeepSeek-V3: 128k x 61 x 8 x 4 B = 250 MB raw, 333 MB base64) are refused while streaming.
BODY_MAX = 1 << 30
INFO_MAX = 1 << 24              # an info endpoint's JSON (server args, model list)


@dataclass(frozen=True)
class ClientConfig:
    """timeout_s: per-request limit (connect + whole response); tries: attempts per request;
    backoff_s / backoff_max_s: the first retry's wait and the cap (doubling, with jitter);
    concurrency: requests in flight (the connection pool holds as many)."""

    concurrency: int = 32
    timeout_s: float = 600.0
    tries: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0


class Transient(Exception):
    """A failure worth retrying (connect error, timeout, 429, 5xx)."""


class EngineClient:
    """`async with EngineClient(url, config) as c: obj = await c.post_json(path, body)`."""

    def __init__(self, url: str, config: ClientConfig = ClientConfig()):
        self.url = check_url(url).rstrip("/")
        self.config = config
        self.retries = 0
        self._client = None

    async def __aenter__(self) -> "EngineClient":
        import aiohttp

        connector = aiohttp.TCPConnector(limit=self.config.concurrency)
        self._client = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.config.timeout_s),
            trust_env=False, auto_decompress=True)
        return self

    async def __aexit__(self, *exc) -> None:
        await self._client.close()

    async def _once(self, method: str, path: str, body: bytes | None,
                    limit: int) -> tuple[int, bytes]:
        import aiohttp

        try:
            async with self._client.request(
                    method, self.url + path, data=body, allow_redirects=False,
                    headers={"content-type": "application/json"} if body is not None else None
            ) as resp:
                size = resp.content_length
                if size is not None and size > limit:
                    raise InputError(f"{self.url}{path}: response of {size} bytes is larger "
                                     f"than any answer to this request ({limit} bytes)")
                if size is not None:
                    data = await resp.read()
                else:                            # chunked: counted as it streams in
                    chunks, got = [], 0
                    async for chunk in resp.content.iter_chunked(1 << 20):
                        got += len(chunk)
                        if got > limit:
                            raise InputError(f"{self.url}{path}: response larger than any "
                                             f"answer to this request ({limit} bytes)")
                        chunks.append(chunk)
                    data = b"".join(chunks)
                status = resp.status
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                aiohttp.ClientResponseError, asyncio.TimeoutError) as err:
            raise Transient(f"{type(err).__name__}: {str(err)[:120] or 'no detail'}") from None
        if status == 429 or status >= 500:
            raise Transient(f"HTTP {status}: {_message(data)}")
        return status, data

    async def request(self, method: str, path: str, body: bytes | None = None,
                      limit: int = BODY_MAX) -> tuple[int, bytes]:
        """(status, body) after retrying transient failures; InputError once tries run out. A
        body above `limit` bytes is refused before it is read whole."""
        wait = self.config.backoff_s
        for attempt in range(self.config.tries):
            try:
                return await self._once(method, path, body, min(limit, BODY_MAX))
            except Transient as err:
                last = str(err)
                if attempt + 1 == self.config.tries:
                    break
                self.retries += 1
                await asyncio.sleep(wait * (0.5 + random.random()))
                wait = min(wait * 2, self.config.backoff_max_s)
        raise InputError(f"{self.url}{path}: server unreachable or failing after "
                         f"{self.config.tries} tries ({last})")

    async def post_json(self, path: str, obj: Any, limit: int = BODY_MAX) -> Any:
        status, data = await self.request("POST", path, orjson.dumps(obj), limit)
        if status >= 400:
            raise InputError(f"{self.url}{path}: HTTP {status}: {_message(data)}")
        return _json(data, f"{self.url}{path}")

    async def get_json(self, path: str) -> Any | None:
        """The JSON at `path`, or None when the server has no such endpoint (4xx)."""
        status, data = await self.request("GET", path, limit=INFO_MAX)
        if status >= 400:
            return None
        try:
            return orjson.loads(data)       # nesting above 1,024 is a ValueError here too
        except ValueError:
            return None


def check_url(url: str) -> str:
    """`url` when it is an http(s) URL with a host and a valid port, else one line (a bracket
    left open, `http://[::1`, would reach aiohttp's parser as a ValueError)."""
    from urllib.parse import urlsplit

    if not url.startswith(("http://", "https://")):
        raise InputError(f"--url: {url[:200]!r} is not an http:// or https:// URL")
    try:
        parts = urlsplit(url)
        parts.port                          # raises on a port that is not a number in range
        import yarl

        yarl.URL(url)
    except ValueError as err:
        raise InputError(f"--url: {url[:200]!r} is not a valid URL ({err})") from None
    if not parts.hostname or any(c in url for c in " \t\r\n"):
        raise InputError(f"--url: {url[:200]!r} names no host")
    return url


def _json(data: bytes, where: str) -> Any:
    """The response's JSON: orjson parses a 432 KiB SGLang answer in 0.14 ms of CPU, the
    stdlib's json in 0.30 ms (half the client's per-response decoding)."""
    try:
        return orjson.loads(data)
    except ValueError:
        raise InputError(f"{where}: response is not JSON ({data[:60]!r})") from None


def _message(data: bytes) -> str:
    """The error text of an engine's error body (SGLang / vLLM / FastAPI shapes), one line."""
    try:
        obj = orjson.loads(data)
    except ValueError:
        return " ".join(data[:200].decode("utf-8", "replace").split()) or "no body"
    if isinstance(obj, dict):
        for key in ("error", "detail", "message"):
            v = obj.get(key)
            if isinstance(v, dict):
                v = v.get("message", v)
            if v:
                return " ".join(str(v)[:200].split())
    return " ".join(str(obj)[:200].split())
