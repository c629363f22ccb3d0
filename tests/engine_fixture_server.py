"""TEST FIXTURE, never shipped: a loopback HTTP server that speaks SGLang's `/generate` and vLLM's
token-in-token-out `/inference/v1/generate` with routed-expert return, for `sempar capture`'s
tests and benchmark. It is not an engine.

Two modes:

- `ModelBackend`: runs one of our tiny models (tiny-moe64, tiny-mixtral) for real, greedy and
  without a KV cache: the prompt is one forward pass (its rows are the prefill routing), then each
  generated token but the last is forwarded as the last row of one more pass (its decode routing).
  The routers' choices are read by `sempar.trace.routers` (the same hooks `sempar record` uses)
  and serialised as the engine does: SGLang with `pybase64.b64encode(int32 array .tobytes())`
  (`detokenizer_manager._b64_encode_per_request`), vLLM with its own `numpy2base64` when vLLM is
  importable (else `np.save` + base64, the same bytes), uint8 up to 256 experts as vLLM's
  capturer narrows.
- `ReplayBackend`: returns precomputed response bodies (the benchmark: the client is measured,
  not a model).

`Faults` injects what the refusal tests need: a server without the routed-experts flag, another
version, transient 503s, hostile payloads, a delay per request.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

SGLANG_VERSION, VLLM_VERSION = "0.5.23", "0.33.0"

# The `vllm-openai` route reads the body with vLLM's own CompletionRequest and writes the answer
# with its CompletionResponse: tests of that route need the `engines` extra (vLLM installed
# --no-deps) and the `engine-protocols` extra (what those classes import), which only CI adds.
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason=f"vLLM is not installed (the `engines` extra: pip install --no-deps vllm=={VLLM_VERSION}, "
           "plus the `engine-protocols` extra; .ci/run installs both)")


def sglang_b64(arr: np.ndarray) -> str:
    """SGLang's encoding (detokenizer_manager): base64 of the int32 array's raw bytes."""
    import pybase64

    return pybase64.b64encode(np.ascontiguousarray(arr, np.int32).tobytes()).decode("utf-8")


def vllm_b64(arr: np.ndarray) -> str:
    """vLLM's encoding (utils/serial_utils.numpy2base64) of the narrowed array."""
    try:
        from vllm.utils.serial_utils import numpy2base64
    except Exception:                     # noqa: BLE001 - vLLM absent or not importable
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        return base64.b64encode(buf.getvalue()).decode("ascii")
    return numpy2base64(arr)


@dataclass
class Faults:
    flag: bool = True                     # started with --enable-return-routed-experts
    version: str | None = None            # None: the pinned version
    fail_first: int = 0                   # answer the first N generate requests with 503
    payload: str = "ok"                   # ok | short | out_of_range | pickle | float | huge |
                                          # fortran | bloat (a 4 MiB envelope)
    delay_s: float = 0.0                  # sleep before answering each generate request
    duplicate_after: int | None = None    # from this many answers on, a row repeats an expert
    served: int = 0                       # generate requests answered (200)
    seen: int = 0


class ModelBackend:
    """Routes every request through a tiny model for real (module docstring)."""

    def __init__(self, model: str):
        import torch

        from sempar.models import load_model, resolve_model
        from sempar.trace.routers import find_routers

        self.torch = torch
        self.source = resolve_model(model)
        self.model = load_model(self.source.model_dir)
        self.sites = find_routers(self.model)
        cfg = self.model.config
        self.hidden_layers = int(cfg.num_hidden_layers)
        self.layer_ids = [s.layer_id for s in self.sites]
        self.top_k = int(self.sites[0].module.top_k)
        self.num_experts = int(self.sites[0].module.num_experts)
        self.lock = threading.Lock()

    def run(self, prompt: list[int], max_new: int) -> tuple[list[int], np.ndarray]:
        """(output ids [M], routed int32[P + M - 1, hidden_layers, k]) of a greedy generation."""
        from sempar.trace.routers import RoutingCapture, sort_by_weight

        torch = self.torch
        seq, rows = list(prompt), []
        with self.lock, RoutingCapture(self.sites, self.top_k, self.num_experts) as cap, \
                torch.no_grad():
            for step in range(max_new):
                n = len(seq)
                cap.expect(n)
                out = self.model(input_ids=torch.tensor([seq]), use_cache=False, logits_to_keep=1)
                experts, weights = cap.take()                      # [n, L, k]
                T, L, k = experts.shape
                e, _ = sort_by_weight(experts.reshape(T * L, k), weights.reshape(T * L, k))
                e = e.reshape(T, L, k)
                rows.append(e if step == 0 else e[-1:])
                seq.append(int(out.logits[0, -1].argmax()))
        moe = np.concatenate(rows)[: len(seq) - 1]
        full = np.zeros((moe.shape[0], self.hidden_layers, self.top_k), np.int32)
        full[:, self.layer_ids, :] = moe
        return seq[len(prompt):], full


class RandomBackend:
    """Routing drawn at random for a given model shape (the refusal tests: no model to load);
    output token i is 10 + i."""

    def __init__(self, hidden_layers: int, layer_ids: list[int], top_k: int, num_experts: int):
        self.hidden_layers, self.layer_ids = hidden_layers, layer_ids
        self.top_k, self.num_experts = top_k, num_experts
        self.rng = np.random.default_rng(0)

    def run(self, prompt: list[int], max_new: int) -> tuple[list[int], np.ndarray]:
        rows = len(prompt) + max_new - 1
        full = np.zeros((rows, self.hidden_layers, self.top_k), np.int32)
        scores = self.rng.random((rows, len(self.layer_ids), self.num_experts))
        full[:, self.layer_ids, :] = np.argsort(scores, axis=2)[:, :, :self.top_k]
        return [10 + i for i in range(max_new)], full


class ReplayBackend:
    """Precomputed answers: `bodies[engine]` is a list of (prompt_len, body bytes), cycled."""

    def __init__(self, bodies: dict[str, list[bytes]]):
        self.bodies = bodies
        self.i = 0


def _hostile(arr: np.ndarray, engine: str, mode: str, num_experts: int) -> str:
    if mode == "bloat":
        mode = "ok"
    if mode == "short":
        arr = arr.reshape(-1)[:-1]
    elif mode == "out_of_range":
        arr = arr.copy()
        arr.reshape(-1)[0] = num_experts
    if engine == "sglang":
        if mode == "huge":
            return "A" * (arr.size * 4 * 4 + 64)
        return sglang_b64(arr)
    buf = io.BytesIO()
    if mode == "pickle":
        np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    elif mode == "float":
        np.save(buf, arr.astype(np.float32))
    elif mode == "fortran":
        np.save(buf, np.asfortranarray(arr.astype(np.int32)))
    elif mode == "huge":
        header = "{'descr': '<i4', 'fortran_order': False, 'shape': (100000000000, %d, %d), }" % (
            arr.shape[1], arr.shape[2])
        raw = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
        return base64.b64encode(raw + b"\0" * 64).decode()
    else:
        narrow = np.uint8 if num_experts <= 256 else np.uint16
        return vllm_b64(arr.astype(narrow) if mode == "ok" else arr)
    return base64.b64encode(buf.getvalue()).decode()


def make_app(backend: Any, faults: Faults, model_path: str | None = None):
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def generate(request: Request, engine: str) -> Response:
        import asyncio

        faults.seen += 1
        if faults.seen <= faults.fail_first:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        if faults.delay_s:
            await asyncio.sleep(faults.delay_s)
        if isinstance(backend, ReplayBackend):        # the request is read, not parsed
            await request.body()
            bodies = backend.bodies[engine]
            backend.i += 1
            faults.served += 1
            return Response(bodies[backend.i % len(bodies)], media_type="application/json")
        body = await request.json()
        if engine == "vllm-openai":             # vLLM's own request class reads the body
            from vllm.entrypoints.openai.completion.protocol import CompletionRequest

            req = CompletionRequest(**body)
            prompt, max_new, start = req.prompt, req.max_tokens, req.routed_experts_prompt_start
        elif engine == "sglang":
            prompt, max_new = body["input_ids"], body["sampling_params"]["max_new_tokens"]
            start = body.get("routed_experts_start_len", 0)
        else:
            prompt, max_new = body["token_ids"], body["sampling_params"]["max_tokens"]
            start = body["sampling_params"].get("routed_experts_prompt_start", 0)
        output, routed = await run_in_threadpool(backend.run, prompt, max_new)
        routed = routed[start:]
        if faults.duplicate_after is not None and faults.served >= faults.duplicate_after:
            routed = routed.copy()
            routed[0, :, 1] = routed[0, :, 0]
        payload = _hostile(routed, engine, faults.payload, backend.num_experts) \
            if faults.flag else None
        faults.served += 1
        if engine == "sglang":
            meta = {"id": "x", "prompt_tokens": len(prompt), "completion_tokens": len(output),
                    "finish_reason": {"type": "length", "length": max_new}}
            if payload is not None:
                meta["routed_experts"] = payload
            text = "x" * (4 << 20) if faults.payload == "bloat" else ""
            return JSONResponse({"text": text, "output_ids": output, "meta_info": meta})
        if engine == "vllm-openai":             # and its own response classes write the answer
            from vllm.entrypoints.openai.completion.protocol import (CompletionResponse,
                                                                     CompletionResponseChoice)
            from vllm.entrypoints.serve.engine.protocol import UsageInfo

            ids = req.return_token_ids
            resp = CompletionResponse(model="m", usage=UsageInfo(
                prompt_tokens=len(prompt), completion_tokens=len(output)), choices=[
                CompletionResponseChoice(index=0, text="", finish_reason="length",
                                         prompt_token_ids=prompt if ids else None,
                                         token_ids=output if ids else None,
                                         routed_experts=payload)])
            return Response(resp.model_dump_json(), media_type="application/json")
        return JSONResponse({"request_id": "x", "prompt_token_ids": prompt, "choices": [
            {"index": 0, "finish_reason": "length", "token_ids": output,
             "routed_experts": payload}]})

    async def sglang_generate(request: Request) -> Response:
        return await generate(request, "sglang")

    async def vllm_generate(request: Request) -> Response:
        return await generate(request, "vllm")

    async def vllm_openai(request: Request) -> Response:
        return await generate(request, "vllm-openai")

    async def server_info(request: Request) -> Response:
        return JSONResponse({"version": faults.version or SGLANG_VERSION,
                             "enable_return_routed_experts": faults.flag})

    async def model_info(request: Request) -> Response:
        return JSONResponse({"model_path": model_path, "model_type": None})

    async def version(request: Request) -> Response:
        return JSONResponse({"version": faults.version or VLLM_VERSION})

    async def models(request: Request) -> Response:
        return JSONResponse({"data": [{"id": "m", "root": model_path}]})

    return Starlette(routes=[Route("/generate", sglang_generate, methods=["POST"]),
                             Route("/inference/v1/generate", vllm_generate, methods=["POST"]),
                             Route("/v1/completions", vllm_openai, methods=["POST"]),
                             Route("/server_info", server_info), Route("/model_info", model_info),
                             Route("/version", version), Route("/v1/models", models)])


class FixtureServer:
    """`with FixtureServer(app) as url:` serves `app` on 127.0.0.1 (a free port) in a thread."""

    def __init__(self, app: Any):
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def replay_bodies(engine: str, n_distinct: int, prompt_len: int, output_len: int,
                  hidden_layers: int, layer_ids: list[int], top_k: int, num_experts: int,
                  seed: int = 0) -> list[bytes]:
    """`n_distinct` response bodies of `engine` with random routing (ids distinct per row)."""
    rng = np.random.default_rng(seed)
    rows = prompt_len + output_len - 1
    out = []
    for _ in range(n_distinct):
        full = np.zeros((rows, hidden_layers, top_k), np.int32)
        scores = rng.random((rows, len(layer_ids), num_experts), dtype=np.float32)
        full[:, layer_ids, :] = np.argpartition(scores, top_k, axis=2)[:, :, :top_k]
        output = rng.integers(0, 1000, output_len).tolist()
        if engine == "sglang":
            obj = {"text": "", "output_ids": output, "meta_info": {
                "prompt_tokens": prompt_len, "completion_tokens": output_len,
                "routed_experts": sglang_b64(full)}}
        else:
            narrow = np.uint8 if num_experts <= 256 else np.uint16
            obj = {"choices": [{"index": 0, "token_ids": output,
                                "routed_experts": vllm_b64(full.astype(narrow))}]}
        out.append(json.dumps(obj).encode())
    return out


def main() -> None:
    """`python tests/engine_fixture_server.py --replay sglang|vllm ...`: serve precomputed bodies
    in this process until killed, printing the URL on stdout (the capture benchmark)."""
    import argparse

    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", choices=["sglang", "vllm"], required=True)
    ap.add_argument("--distinct", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, required=True)
    ap.add_argument("--output-len", type=int, required=True)
    ap.add_argument("--hidden-layers", type=int, required=True)
    ap.add_argument("--layer-ids", required=True, help="comma-separated MoE layer numbers")
    ap.add_argument("--top-k", type=int, required=True)
    ap.add_argument("--experts", type=int, required=True)
    args = ap.parse_args()
    bodies = replay_bodies(args.replay, args.distinct, args.prompt_len, args.output_len,
                           args.hidden_layers, [int(x) for x in args.layer_ids.split(",")],
                           args.top_k, args.experts)
    app = make_app(ReplayBackend({args.replay: bodies}), Faults())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off", access_log=False)
                   ).run(sockets=[sock])


if __name__ == "__main__":
    main()
