"""`RouterConfig`: every knob of one router process, typed and checked once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sempar.errors import InputError

MAX_BODY_BYTES = 16 << 20        # 16 MiB: a 128k-token prompt as text is ~0.5 MiB


def redact_url(url: str) -> str:
    """`url` with the password of its user-info, if any, replaced by *** (ValueError when it
    does not parse)."""
    u = urlsplit(url)
    if u.password is None:
        return url
    host = u.netloc.rpartition("@")[2]
    return u._replace(netloc=f"{u.username or ''}:***@{host}").geturl()


@dataclass(frozen=True)
class RouterConfig:
    """upstream: base URL of the engine's HTTP server (http://host:port, no path); engine: a
    name of `engines.ENGINES`; dp_size: the engine's data-parallel ranks G; policy: a name of
    `schedule.requests.REQUEST_POLICIES`; max_inflight_per_rank: requests a rank may hold before the
    router stops sending it more (all ranks full -> 429); max_body_bytes: the request body limit;
    connect_timeout_s / read_timeout_s: to the upstream (read: between two received chunks);
    api_key: when set, clients must send `Authorization: Bearer KEY`; log_routing: a JSONL file
    of (request, tokens, rank); graceful_s: how long shutdown waits for in-flight streams;
    tokenize_bytes: bytes of big bodies (over `request.THREAD_BYTES`) parsed and tokenized at
    once in worker threads (a tokenizer holds ~140x a prompt's bytes: 2.2 GB for 15 MB), one
    body always admitted, beyond it 429 + Retry-After."""

    upstream: str
    engine: str
    dp_size: int
    host: str = "127.0.0.1"
    port: int = 30080
    policy: str = "expert-idf"
    max_inflight_per_rank: int = 256
    max_body_bytes: int = MAX_BODY_BYTES
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    api_key: str | None = None
    log_routing: Path | None = None
    graceful_s: float = 30.0
    tokenize_bytes: int = MAX_BODY_BYTES

    @property
    def upstream_shown(self) -> str:
        """`upstream` with any password replaced by *** (for logs)."""
        return redact_url(self.upstream)

    def __post_init__(self) -> None:
        try:
            u = urlsplit(self.upstream)
            ok = (u.scheme in ("http", "https") and bool(u.hostname) and u.path in ("", "/")
                  and (u.port or 0) >= 0)           # .port raises on a port that is no number
            shown = redact_url(self.upstream)
        except ValueError:                          # 'http://[::1' and the like
            ok, shown = False, "the URL given"
        if not ok:
            raise InputError(f"--upstream: {shown!r} is not http(s)://host:port")
        object.__setattr__(self, "upstream", self.upstream.rstrip("/"))
        for name, lo in (("dp_size", 1), ("max_inflight_per_rank", 1), ("max_body_bytes", 1),
                         ("tokenize_bytes", 1)):
            if getattr(self, name) < lo:
                raise InputError(f"--{name.replace('_', '-')}: {getattr(self, name)} (need >= {lo})")
        if not 0 <= self.port <= 65535:
            raise InputError(f"--port: {self.port} is not in 0..65535")
        key = self.api_key
        if key is not None and (not key.strip() or key != key.strip() or not key.isprintable()):
            raise InputError("--api-key: empty, or with spaces or control characters at its ends "
                             "(it would admit `Authorization: Bearer ` or never match)")
        for name in ("connect_timeout_s", "read_timeout_s", "graceful_s"):
            if not getattr(self, name) > 0:
                raise InputError(f"{name}: {getattr(self, name)} (need > 0)")
