"""`sempar capture`: routing from a running SGLang or vLLM server (routed-expert return), streamed
into a trace (sempar/capture/)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import POSITIVE_SECONDS, bound
from sempar.commands._names import capture_engines, names_option
from sempar.commands._options import json_option, optional_seed_option
from sempar.console import emit_json


def capture_cmd(url: str = typer.Option(..., "--url", help="the engine's base URL, e.g. "
                                                            "http://127.0.0.1:30000"),
                engine_name: str = names_option(..., "--engine", capture_engines, single=True,
                                                help="the engine's kind"),
                prompts: Path = typer.Option(..., "--prompts",
                                             help="JSON lines: text or input_ids, optional "
                                                  "domain and id"),
                out_file: Path = typer.Option(..., "--out", help="Parquet trace to write (an "
                                                                  "interrupted one resumes)"),
                model_dir: Optional[str] = typer.Option(None, "--model-dir",
                                                        help="model folder (config.json, "
                                                             "tokenizer.json) or packaged name; "
                                                             "default: the server's, if local"),
                max_new_tokens: int = typer.Option(64, "--max-new-tokens",
                                                   callback=bound(1, 1 << 20),
                                                   help="tokens generated per request (greedy)"),
                concurrency: int = typer.Option(32, "--concurrency", callback=bound(1, 4096),
                                                help="requests in flight"),
                requests: Optional[int] = typer.Option(None, "--requests",
                                                       callback=bound(1, 100_000_000),
                                                       help="requests to send, cycling through "
                                                            "the prompts (default: one each)"),
                seed: Optional[int] = optional_seed_option("the engine's sampling seed"),
                timeout: float = typer.Option(600.0, "--timeout", callback=POSITIVE_SECONDS,
                                              help="seconds per request"),
                tries: int = typer.Option(5, "--tries", callback=bound(1, 100),
                                          help="attempts per request on transient errors "
                                               "(connect, timeout, 429, 5xx), backing off"),
                as_json: bool = json_option()) -> None:
    """Send prompts to a running engine with routed-expert return on; write every request's
    routing (prefill and decode rows) to a trace."""
    from sempar.atomic import check_input, check_output
    from sempar.capture.client import ClientConfig, check_url
    from sempar.capture.job import CaptureJob, CaptureSettings
    from sempar.capture.prompts import read_prompts
    from sempar.capture.setup import model_shape, probe_server
    from sempar.progress import progress_bar

    from sempar.capture.engines import ENGINES

    ENGINES.get(engine_name)                  # every check without the network or model first
    check_url(url)
    check_input(prompts, "--prompts JSON-lines file")
    check_output(out_file, prompts)
    config = ClientConfig(concurrency=concurrency, timeout_s=timeout, tries=tries)
    found = probe_server(engine_name, url, config)
    model, shape, tokenizer = model_shape(model_dir, found["model_path"])
    parsed = read_prompts(prompts, tokenizer)
    n = requests if requests is not None else len(parsed.ids)
    settings = CaptureSettings(engine=engine_name, url=url, requests=n,
                               max_new_tokens=max_new_tokens, seed=seed, client=config)
    job = CaptureJob(settings, parsed, shape, model, prompts.name, found["version"])
    with progress_bar(f"capture {engine_name}", n) as advance:
        summary = job.run(out_file, progress=advance)
    if as_json:
        emit_json(summary)
    sys.stderr.write(f"wrote {out_file}: {summary['requests']} requests, {summary['tokens']} "
                     f"tokens ({summary['prefill_rows']} prefill, {summary['decode_rows']} decode "
                     f"rows), {summary['layers']} MoE layers x {summary['experts']} experts, "
                     f"top-{summary['top_k']}\n")


def register(app: typer.Typer) -> None:
    app.command("capture")(capture_cmd)
