"""The engines `sempar capture` speaks, registered once with what each supports.

An `EngineSpec` names the engine's generate endpoint, the request fields that switch routed-expert
return on, the server flag without which it returns none, the info endpoints telling its version,
the versions whose payload format we know, and how one response reads (`parse`) into a
`Routed` (token counts and the base64 payload), which `payload` decodes.

| engine | endpoint                     | switch (request)                                   | server flag                      | payload                  |
| ------ | ---------------------------- | -------------------------------------------------- | -------------------------------- | ------------------------ |
| sglang | POST /generate               | return_routed_experts, routed_experts_start_len    | --enable-return-routed-experts   | raw int32, base64        |
| vllm   | POST /inference/v1/generate  | sampling_params.routed_experts_prompt_start        | --enable-return-routed-experts   | .npy (u8/u16/i32), base64 |
| vllm-openai | POST /v1/completions    | routed_experts_prompt_start, return_token_ids      | --enable-return-routed-experts   | .npy (u8/u16/i32), base64 |

vLLM 0.33.0's OpenAI routes carry the routed experts per choice (`CompletionResponseChoice` and
`ChatCompletionResponseChoice.routed_experts`, the same `.npy` base64 as the token-in-token-out
route) and take `routed_experts_prompt_start` on the request; there is no top-level
`prompt_routed_experts` in 0.33.0 (newer releases add it). `vllm-openai` sends token ids as the
completion `prompt` with `return_token_ids` so the choice carries `prompt_token_ids` and
`token_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from sempar.capture.payload import PayloadShape, decode_npy, decode_sglang
from sempar.errors import InputError
from sempar.registry import Registry


@dataclass
class Routed:
    """One engine response, read: prompt token ids (None when the response does not carry them),
    output token ids int[M], prompt length P, the payload's first position `start` (None: infer
    it from the payload size) and the base64 payload (None: the server returned none)."""

    prompt_ids: list[int] | None
    output_ids: list[int]
    prompt_len: int
    start: int | None
    payload: str | None


@dataclass(frozen=True)
class EngineSpec:
    name: str
    generate_path: str
    flag: str                                  # the server flag routed-expert return needs
    version_paths: tuple[str, ...]             # GET endpoints whose JSON holds "version"
    versions: tuple[str, ...]                  # version prefixes whose format we know
    build: Callable[[list[int], int, int | None], dict[str, Any]]
    parse: Callable[[Any, str], "Routed"]
    decode: Callable[..., np.ndarray]
    flag_check: Callable[[Any], bool | None]   # server info JSON -> flag on? (None: unknown)
    returns_prompt_ids: bool                   # the response itself carries the prompt's ids

    def known_version(self, version: str) -> bool:
        return any(version == v or version.startswith(v + ".") for v in self.versions)


ENGINES: Registry[EngineSpec] = Registry("engine")


def _ids(value: Any, what: str) -> list[int]:
    from sempar.bounds import token_ids

    return token_ids(value, what)


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 31:
        raise InputError(f"{what}: {str(value)[:40]!r} is not a token count")
    return value


# ---- SGLang 0.5.23 --------------------------------------------------------------------------

def _sglang_build(prompt_ids: list[int], max_new_tokens: int, seed: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    if seed is not None:
        params["sampling_seed"] = seed
    return {"input_ids": prompt_ids, "sampling_params": params, "return_routed_experts": True,
            "routed_experts_start_len": 0, "stream": False}


def _sglang_parse(obj: Any, what: str) -> Routed:
    """A /generate response: {"output_ids", "meta_info": {prompt_tokens, completion_tokens,
    routed_experts, finish_reason}} (tokenizer_manager; a batch answers a list, refused)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("meta_info"), dict):
        raise InputError(f"{what}: not an SGLang /generate response (no meta_info object)")
    meta = obj["meta_info"]
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise InputError(f"{what}: SGLang aborted the request: {str(finish.get('message'))[:200]}")
    output = _ids(obj.get("output_ids"), f"{what}: output_ids")
    P = _count(meta.get("prompt_tokens"), f"{what}: meta_info.prompt_tokens")
    M = _count(meta.get("completion_tokens", len(output)), f"{what}: meta_info.completion_tokens")
    if M != len(output):
        raise InputError(f"{what}: completion_tokens {M} but {len(output)} output_ids")
    prompt = obj.get("prompt_token_ids")
    prompt = _ids(prompt, f"{what}: prompt_token_ids") if prompt is not None else None
    if prompt is not None and len(prompt) != P:
        raise InputError(f"{what}: prompt_tokens {P} but {len(prompt)} prompt_token_ids")
    return Routed(prompt, output, P, None, meta.get("routed_experts"))


def _sglang_flag(info: Any) -> bool | None:
    if isinstance(info, dict) and "enable_return_routed_experts" in info:
        return bool(info["enable_return_routed_experts"])
    return None


ENGINES.add("sglang", EngineSpec(
    name="sglang", generate_path="/generate", flag="--enable-return-routed-experts",
    version_paths=("/server_info", "/get_server_info", "/version"), versions=("0.5",),
    build=_sglang_build, parse=_sglang_parse, decode=decode_sglang, flag_check=_sglang_flag,
    returns_prompt_ids=False))


# ---- vLLM 0.33.0 ----------------------------------------------------------------------------

def _vllm_build(prompt_ids: list[int], max_new_tokens: int, seed: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"max_tokens": max_new_tokens, "temperature": 0.0,
                              "routed_experts_prompt_start": 0}
    if seed is not None:
        params["seed"] = seed
    return {"token_ids": prompt_ids, "sampling_params": params, "stream": False}


def _vllm_parse(obj: Any, what: str) -> Routed:
    """A GenerateTokensResponse: {"prompt_token_ids"?, "choices": [{"token_ids",
    "routed_experts"}]} (token_in_token_out/protocol.py), or a CompletionResponse whose choice
    carries "prompt_token_ids" itself (openai/completion/protocol.py, `return_token_ids`); one
    choice (n = 1) is read."""
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
        raise InputError(f"{what}: not a vLLM generate response (no choices list)")
    if len(obj["choices"]) != 1 or not isinstance(obj["choices"][0], dict):
        raise InputError(f"{what}: {len(obj['choices'])} choices; capture reads n = 1 responses")
    choice = obj["choices"][0]
    if choice.get("finish_reason") == "abort":
        raise InputError(f"{what}: vLLM aborted the request")
    output = _ids(choice.get("token_ids"), f"{what}: choices[0].token_ids")
    prompt = obj.get("prompt_token_ids")
    if prompt is None:
        prompt = choice.get("prompt_token_ids")
    prompt = _ids(prompt, f"{what}: prompt_token_ids") if prompt is not None else None
    P = len(prompt) if prompt is not None else -1
    return Routed(prompt, output, P, None, choice.get("routed_experts"))


ENGINES.add("vllm", EngineSpec(
    name="vllm", generate_path="/inference/v1/generate", flag="--enable-return-routed-experts",
    version_paths=("/version",), versions=("0.33",),
    build=_vllm_build, parse=_vllm_parse, decode=decode_npy, flag_check=lambda info: None,
    returns_prompt_ids=True))


def _vllm_openai_build(prompt_ids: list[int], max_new_tokens: int,
                       seed: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt_ids, "max_tokens": max_new_tokens,
                            "temperature": 0.0, "return_token_ids": True,
                            "routed_experts_prompt_start": 0, "stream": False}
    if seed is not None:
        body["seed"] = seed
    return body


ENGINES.add("vllm-openai", EngineSpec(
    name="vllm-openai", generate_path="/v1/completions", flag="--enable-return-routed-experts",
    version_paths=("/version",), versions=("0.33",),
    build=_vllm_openai_build, parse=_vllm_parse, decode=decode_npy,
    flag_check=lambda info: None, returns_prompt_ids=True))


def engine(name: str) -> EngineSpec:
    return ENGINES.get(name)


def shape_of(layer_ids: tuple[int, ...], num_hidden_layers: int, top_k: int,
             num_experts: int) -> PayloadShape:
    return PayloadShape(num_hidden_layers, top_k, num_experts, tuple(layer_ids))
