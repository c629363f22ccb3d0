"""`load_router` checks every input once (placement, tokenizer, policy) and builds the app;
`serve` runs it under uvicorn (uvloop and httptools when installed) with a graceful shutdown:
on SIGTERM / SIGINT the listening socket closes, in-flight streams run to their end for up to
`graceful_s` seconds, then the process exits."""

from __future__ import annotations

import json
import logging
import os
import sys

from sempar.errors import InputError
from sempar.router.config import RouterConfig


class JsonLines(logging.Formatter):
    """A log record as one JSON object: time, level, logger and the message (already JSON for
    the router's own events, which carry no header and no prompt text)."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        try:
            body = json.loads(msg) if msg.startswith("{") else {"message": msg}
        except ValueError:
            body = {"message": msg}
        return json.dumps({"time": round(record.created, 6), "level": record.levelname.lower(),
                           "logger": record.name, **body})


def load_router(cfg: RouterConfig, placement_path: str, model_dir: str):
    """The app for `cfg`, or InputError naming the first bad input."""
    from sempar.placement.placement import Placement
    from sempar.router.app import build_app
    from sempar.router.engines import ENGINES
    from sempar.router.policies import make_router_policy, reads_table
    from sempar.prompt import PromptTokenizer

    ENGINES.get(cfg.engine)
    needs_table = reads_table(cfg.policy)
    try:
        placement = Placement.load(placement_path)
    except InputError:
        raise
    except Exception as err:                       # any malformed file: one line, which file
        raise InputError(f"--placement: {placement_path} is not a sempar placement: "
                         f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                         ) from None
    if needs_table and placement.token_table is None:
        raise InputError(f"--placement: {placement_path} has no token table; policy "
                         f"{cfg.policy!r} needs one (place with --method sempar --mode dp)")
    if placement.num_devices != cfg.dp_size:
        raise InputError(f"--dp-size: {cfg.dp_size}, but the placement is for "
                         f"{placement.num_devices} ranks")
    # One prompt per call: the tokenizer's thread pool only adds a hand-off, which on a busy
    # host costs ms (measured under load: p50 0.28 against 0.33-0.46 ms, p90 0.7 against 2-5
    # ms for 512 tokens). A user's own setting wins.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = PromptTokenizer(model_dir)
    policy = make_router_policy(cfg.policy, cfg.dp_size, placement.token_table)
    if cfg.log_routing is not None:
        check_routing_log(cfg.log_routing, placement_path, model_dir)
    return build_app(cfg, policy, tokenizer)


LOG_KEYS = frozenset({"request", "t", "route", "rank", "tokens"})


def check_routing_log(path, *inputs) -> None:
    """`--log-routing` under the output rule (`sempar.output_rule.check_output`: not an input
    such as the placement, not a FIFO / device / folder, parent writable), and appended to only
    when it is empty or already a routing log (its first line one of ours): a foreign file is
    refused, never appended to."""
    from sempar.output_rule import check_output

    real = check_output(path, *inputs, option="--log-routing")
    if not real.parent.is_dir():        # appended to for the router's life: not made here
        raise InputError(f"--log-routing: the folder {real.parent} does not exist; make it "
                         "first")
    if not real.exists() or real.stat().st_size == 0:
        return
    try:
        with open(real, "rb") as f:
            first = json.loads(f.readline(1 << 20))
        ours = isinstance(first, dict) and set(first) == LOG_KEYS
    except (OSError, ValueError, RecursionError):
        ours = False
    if not ours:
        raise InputError(f"--log-routing: {path} exists and is not a sempar routing log; "
                         "name a new file")


def bind(cfg: RouterConfig):
    """The listening socket for --host / --port (port 0: one the system picks), or InputError
    in one line (a port in use, an address not here)."""
    import socket

    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((cfg.host, cfg.port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise InputError(f"--port: cannot listen on {cfg.host}:{cfg.port}: "
                         f"{err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock


def json_logs() -> logging.Logger:
    """The router's logger, and uvicorn's, writing JSON lines on stderr (`JsonLines`): uvicorn's
    own warnings ("Invalid HTTP request received.") included, their tracebacks left out."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    log = logging.getLogger("sempar.router")
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        other = logging.getLogger(name)
        other.handlers[:] = [handler] if name == "uvicorn" else []
        other.propagate = name != "uvicorn"
        other.setLevel(logging.WARNING)
    return log


def uvicorn_config(cfg: RouterConfig, app):
    """uvicorn's Config for the router: no logging config of its own (`json_logs` holds),
    no access log (ours are the structured lines), graceful shutdown after `cfg.graceful_s`."""
    import uvicorn

    return uvicorn.Config(app, log_level="warning", access_log=False, log_config=None,
                          timeout_graceful_shutdown=cfg.graceful_s, loop="auto", http="auto",
                          limit_concurrency=None, server_header=False, date_header=False)


def serve(cfg: RouterConfig, app) -> None:
    """Run `app` until SIGTERM / SIGINT (uvicorn's handlers), JSON-line logs on stderr."""
    import uvicorn

    log = json_logs()
    sock = bind(cfg)
    log.info(json.dumps({"event": "start", "host": cfg.host, "port": sock.getsockname()[1],
                         "upstream": cfg.upstream_shown, "engine": cfg.engine,
                         "dp_size": cfg.dp_size, "policy": cfg.policy}))
    uvicorn.Server(uvicorn_config(cfg, app)).run(sockets=[sock])
