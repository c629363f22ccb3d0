"""The router's forwarded requests read by the engines' own code (the `engines` extra).

What the FakeEngine fixture recorded is handed to:
- SGLang 0.5.23: `OpenAIServingBase.extract_routed_dp_rank_from_header` and vLLM 0.33.0:
  `GenerateBaseServing._get_data_parallel_rank`, the functions themselves, compiled from the
  installed source files (their modules do not import here: SGLang's package needs triton,
  vLLM's serving module xgrammar), called with the recorded headers;
- vLLM's own pydantic request classes (`ChatCompletionRequest`, `CompletionRequest`), which import
  with openai, pyzmq, openai-harmony, fastapi, cachetools, py-cpuinfo and cbor2 installed;
- SGLang's `GenerateReqInput`, `ChatCompletionRequest`, `CompletionRequest`, read from their
  source (they do not import): every key of a forwarded /generate body is one of
  GenerateReqInput's fields, and `routed_dp_rank` is a field of all three.
Each test skips when the engine is not installed.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
from pathlib import Path
from typing import Optional

import httpx
import pytest
from starlette.datastructures import Headers

from test_router import MODEL, chat, placement_file, stack  # noqa: F401 - fixtures
from sempar.prompt import PromptTokenizer


def engine_file(pkg: str, rel: str) -> Path:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{pkg} is not installed (the engines extra)")
    return Path(list(spec.submodule_search_locations)[0]) / rel


def engine_function(path: Path, cls: str, name: str):
    """The engine's own function `cls.name`, compiled alone from its source file."""
    tree = ast.parse(path.read_text())
    node = next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == name)
    node.decorator_list = []
    ns = {"Optional": Optional, "Request": object, "logger": logging.getLogger("engine"),
          "HTTPException": RuntimeError}
    exec(compile(ast.Module([node], []), str(path), "exec"), ns)
    return ns[name]


def class_fields(path: Path, cls: str) -> set[str]:
    """Annotated fields of `cls` and of its bases defined in the same file."""
    classes = {c.name: c for c in ast.parse(path.read_text()).body if isinstance(c, ast.ClassDef)}
    out, todo = set(), [cls]
    while todo:
        c = classes.get(todo.pop())
        if c is None:
            continue
        out |= {s.target.id for s in c.body if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)}
        todo += [b.id for b in c.bases if isinstance(b, ast.Name)]
    return out


class RawRequest:
    def __init__(self, headers: dict):
        self.headers = Headers(headers)       # case-insensitive, as FastAPI's Request.headers


def test_sglang_reads_the_rank_header_and_the_generate_body(stack):  # noqa: F811
    url, fake, _, _ = stack
    base = engine_file("sglang", "srt/entrypoints/openai/serving_base.py")
    extract = engine_function(base, "OpenAIServingBase", "extract_routed_dp_rank_from_header")
    httpx.post(url + "/v1/chat/completions", json=chat("cat dog cat"), timeout=10)
    got = fake.received[-1]
    assert extract(None, RawRequest(got["headers"]), None) == 2
    proto = engine_file("sglang", "srt/entrypoints/openai/protocol.py")
    assert "messages" in class_fields(proto, "ChatCompletionRequest")
    assert set(json.loads(got["body"])) <= class_fields(proto, "ChatCompletionRequest")
    for cls in ("ChatCompletionRequest", "CompletionRequest"):
        assert "routed_dp_rank" in class_fields(proto, cls)
    ids = PromptTokenizer(MODEL).encode(" sun moon")
    httpx.post(url + "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 4},
                                        "stream": False}, timeout=10)
    body = json.loads(fake.received[-1]["body"])
    gen = class_fields(engine_file("sglang", "srt/managers/io_struct.py"), "GenerateReqInput")
    assert set(body) <= gen and body["routed_dp_rank"] == 1


@pytest.mark.slow                        # importing vLLM's protocol takes ~20 s here
@pytest.mark.parametrize("stack", [{"engine": "vllm"}], indirect=True)
def test_vllm_reads_the_rank_header_and_validates_the_body(stack):  # noqa: F811
    url, fake, _, _ = stack
    serving = engine_file("vllm", "entrypoints/generate/base/serving.py")
    get_rank = engine_function(serving, "GenerateBaseServing", "_get_data_parallel_rank")
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    except ImportError as err:
        pytest.skip(f"vLLM's protocol classes do not import: {err}")
    httpx.post(url + "/v1/chat/completions", json=chat("cat dog", stream=True), timeout=10)
    got = fake.received[-1]
    assert get_rank(RawRequest(got["headers"])) == 2
    assert ChatCompletionRequest.model_validate(json.loads(got["body"])).stream is True
    httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "sun moon", "max_tokens": 4},
               timeout=10)
    got = fake.received[-1]
    assert get_rank(RawRequest(got["headers"])) == 1
    assert CompletionRequest.model_validate(json.loads(got["body"])).prompt == "sun moon"
