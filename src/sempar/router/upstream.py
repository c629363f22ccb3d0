"""`Upstream`: the engine's HTTP server, reached through one pooled aiohttp client session.

aiohttp rather than httpx: on this 2-core machine one process posting 512-token prompts to a
loopback upstream, 16 at a time, made ~7,000 requests/s with aiohttp and ~640 with httpx
(benchmarks/bench_router.py measures both; docs/router.md). Responses are not decompressed
(`auto_decompress=False`), so the bytes the client gets are the engine's, and no
`Accept-Encoding` is added that the client did not send.
"""

from __future__ import annotations

import aiohttp

# Hop-by-hop headers (RFC 9110 7.6.1) and those the client library sets itself.
HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                 "trailer", "transfer-encoding", "upgrade", "host", "content-length"})


class UpstreamDown(Exception):
    """The engine refused or dropped the connection (-> 502)."""


class UpstreamTimeout(Exception):
    """The engine did not answer in time (-> 504)."""


def is_timeout(err: BaseException) -> bool:
    """Whether an upstream failure is a timeout (504) rather than a refused / dropped
    connection (502); aiohttp's read timeouts are TimeoutErrors."""
    return isinstance(err, (UpstreamTimeout, TimeoutError))


class Upstream:
    """`open(method, path, headers, body)` -> an aiohttp response whose headers have arrived;
    the caller reads it and must `release()` / `close()` it (closing aborts the upstream
    request, which is how a gone client cancels it)."""

    def __init__(self, base_url: str, connect_timeout_s: float, read_timeout_s: float,
                 max_connections: int = 0):
        self.base = base_url
        self.timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s,
                                             sock_read=read_timeout_s)
        self.max_connections = max_connections
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        conn = aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=conn, timeout=self.timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def open(self, method: str, path: str, headers: dict[str, str], body: bytes | None):
        try:
            return await self.session.request(method, self.base + path, headers=headers,
                                              data=body, allow_redirects=False)
        except (aiohttp.ServerTimeoutError, TimeoutError) as err:
            raise UpstreamTimeout(str(err) or type(err).__name__) from None
        except aiohttp.ClientError as err:        # refused, reset, bad answer
            raise UpstreamDown(str(err) or type(err).__name__) from None


def forward_headers(items, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The client's headers minus hop-by-hop ones, plus `extra` (the rank header). Authorization
    passes through unchanged."""
    drop = HOP | {k.lower() for k in (extra or ())}      # the client's own rank header too
    out = {k: v for k, v in items if k.lower() not in drop}
    if extra:
        out.update(extra)
    return out
