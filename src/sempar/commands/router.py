"""`sempar router`: an OpenAI-compatible, expert-aware request router in front of an engine's
data-parallel ranks (sempar.router; docs/router.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import DEVICES, POSITIVE_SECONDS, bound
from sempar.commands._names import names_option, request_policies, router_engines


POLICY_HELP = "request policy (docs/router.md)"      # + the registry's names (names_help)


def router(placement: Path = typer.Option(..., "--placement", help="sempar placement JSON (dp mode)"),
           upstream: str = typer.Option(..., "--upstream", help="engine base URL, http://host:port"),
           engine: str = names_option(..., "--engine", router_engines, single=True,
                                      help="the engine behind --upstream"),
           dp_size: int = typer.Option(..., "--dp-size", help="the engine's DP ranks", callback=DEVICES),
           model_dir: Path = typer.Option(..., "--model-dir", help="folder with tokenizer.json"),
           host: str = typer.Option("127.0.0.1", "--host", help="address to bind"),
           port: int = typer.Option(30080, "--port", callback=bound(0, 65535)),
           policy: str = names_option("expert-idf", "--policy", request_policies, single=True,
                                      help=POLICY_HELP),
           max_inflight: int = typer.Option(256, "--max-inflight-per-rank",
                                            callback=bound(1, 1 << 20),
                                            help="requests per rank; all full -> 429"),
           max_body: int = typer.Option(16 << 20, "--max-body-bytes", callback=bound(1, 1 << 30)),
           timeout: float = typer.Option(600.0, "--upstream-timeout", callback=POSITIVE_SECONDS,
                                         help="seconds between two upstream chunks -> 504"),
           api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SEMPAR_ROUTER_API_KEY",
                                                 help="clients must send Bearer KEY on every "
                                                      "route, /health and /metrics included"),
           log_routing: Optional[Path] = typer.Option(None, "--log-routing",
                                                      help="JSONL of (request, tokens, rank)"),
           graceful: float = typer.Option(30.0, "--graceful-seconds", callback=POSITIVE_SECONDS,
                                          help="shutdown waits this long for in-flight streams"),
           tokenize_bytes: int = typer.Option(16 << 20, "--max-tokenize-bytes",
                                              callback=bound(1, 1 << 30),
                                              help="bytes of big prompts tokenized at once "
                                                   "(memory ~140x); beyond -> 429"),
           ) -> None:
    """Route OpenAI-style requests to the DP rank whose experts they use (Sem-MoE Alg. 2)."""
    from sempar.router.config import RouterConfig
    from sempar.router.serve import load_router, serve

    cfg = RouterConfig(upstream=upstream, engine=engine, dp_size=dp_size, host=host, port=port,
                       policy=policy, max_inflight_per_rank=max_inflight, max_body_bytes=max_body,
                       read_timeout_s=timeout, api_key=api_key, log_routing=log_routing,
                       graceful_s=graceful, tokenize_bytes=tokenize_bytes)
    app = load_router(cfg, str(placement), str(model_dir))
    serve(cfg, app)


def register(app: typer.Typer) -> None:
    app.command("router")(router)
