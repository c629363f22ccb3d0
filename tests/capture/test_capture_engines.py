"""The routed-expert payloads against the engines' own code (SGLang 0.5.23, vLLM 0.33.0, the
`engines` extra): SGLang's encoder (`DetokenizerManager._b64_encode_per_request`) and decoder
(`extract_routed_experts_from_meta_info`), compiled from the installed sources (their modules
import GPU kernels: triton); vLLM's `numpy2base64` imported as it is, and its token-in-token-out
response classes compiled from `entrypoints/scale_out/token_in_token_out/protocol.py` (the module
imports vLLM's runtime, which needs cbor2 / zmq); our request bodies checked against the fields of
the engines' request classes (`GenerateReqInput`, SGLang's `SamplingParams`, vLLM's
`GenerateRequest` and `SamplingParams`), read from their sources."""

from __future__ import annotations

import ast
import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest

from engine_loaders import compile_function, package_root
from sempar.capture.engines import engine
from sempar.capture.payload import PayloadShape, decode_npy, decode_sglang
from sempar.capture.rows import request_rows
from sempar.errors import InputError

torch = pytest.importorskip("torch")
pybase64 = pytest.importorskip("pybase64")

# DeepSeek-V2-Lite's layout: 27 hidden layers, layer 0 dense, 64 experts, top-6.
SHAPE = PayloadShape(27, 6, 64, tuple(range(1, 27)))


def routing(rows: int, shape: PayloadShape = SHAPE, seed: int = 0) -> np.ndarray:
    """int32[rows, hidden layers, k]: distinct ids per MoE row; the dense layer's column holds
    junk (-1), as a capture buffer's unwritten rows may."""
    rng = np.random.default_rng(seed)
    out = np.full((rows, shape.num_hidden_layers, shape.top_k), -1, np.int32)
    scores = rng.random((rows, len(shape.layer_ids), shape.num_experts))
    out[:, list(shape.layer_ids)] = np.argsort(scores, axis=2)[:, :, :shape.top_k]
    return out


def class_fields(path: Path, name: str) -> set[str]:
    """The annotated fields (and __init__ arguments) of class `name` in an engine source."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)
             and isinstance(n.target, ast.Name)}
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
            names |= {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    return names


# ---- SGLang ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sglang_codec():
    root = package_root("sglang", "sglang")
    from typing import List, Optional

    encode = compile_function(root / "srt/managers/detokenizer_manager.py",
                              "DetokenizerManager._b64_encode_per_request",
                              {"pybase64": pybase64, "torch": torch, "List": List,
                               "Optional": Optional})
    decode = compile_function(root / "srt/state_capturer/routed_experts.py",
                              "extract_routed_experts_from_meta_info",
                              {"np": np, "pybase64": pybase64})
    return root, encode, decode


def test_sglang_round_trip_is_exact(sglang_codec):
    _, encode, decode = sglang_codec
    arr = routing(37)
    [b64] = encode([torch.from_numpy(arr)])
    theirs = decode({"meta_info": {"routed_experts": b64}})
    ours = decode_sglang(b64, 37, SHAPE, "r")
    np.testing.assert_array_equal(theirs, ours.reshape(-1))
    np.testing.assert_array_equal(ours, arr)


def test_sglang_response_rows(sglang_codec):
    """A /generate response: rows are positions [start, P + M - 1), MoE columns only."""
    _, encode, _ = sglang_codec
    P, M, start = 20, 8, 5
    arr = routing(P + M - 1 - start)
    [b64] = encode([torch.from_numpy(arr)])
    resp = {"text": "x", "output_ids": list(range(100, 100 + M)),
            "meta_info": {"prompt_tokens": P, "completion_tokens": M, "routed_experts": b64}}
    spec = engine("sglang")
    prompt = list(range(1, P + 1))
    rows = request_rows(spec, spec.parse(json.loads(json.dumps(resp)), "r"), SHAPE,
                        np.dtype(np.uint8), "r", prompt_ids=prompt, start=start)
    np.testing.assert_array_equal(rows.experts, arr[:, 1:])
    np.testing.assert_array_equal(rows.position, np.arange(start, P + M - 1))
    np.testing.assert_array_equal(rows.token_id, (prompt + resp["output_ids"])[start:P + M - 1])
    inferred = request_rows(spec, spec.parse(resp, "r"), SHAPE, np.dtype(np.uint8), "r",
                            prompt_ids=prompt)              # start from the payload's size
    np.testing.assert_array_equal(inferred.position, rows.position)


def test_sglang_request_fields_exist(sglang_codec):
    root, _, _ = sglang_codec
    body = engine("sglang").build([1, 2, 3], 4, 7)
    assert set(body) <= class_fields(root / "srt/managers/io_struct.py", "GenerateReqInput")
    assert set(body["sampling_params"]) <= class_fields(root / "srt/sampling/sampling_params.py",
                                                        "SamplingParams")


# ---- vLLM -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_root():
    return package_root("vllm", "vllm")


def vllm_response_classes(root: Path) -> dict:
    """GenerateTokensResponse and its choice class, compiled from protocol.py; the types of
    fields capture does not read (logprobs, usage, metrics) stubbed as open pydantic models."""
    import builtins
    import typing

    import pydantic

    path = root / "entrypoints/scale_out/token_in_token_out/protocol.py"
    tree = ast.parse(path.read_text())
    wanted = ("GenerateChoiceBase", "GenerateTokensChoice", "GenerateResponseBase",
              "GenerateTokensResponse")
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in wanted]
    ns: dict = {"random_uuid": lambda: "rid"}
    ns.update({k: getattr(typing, k) for k in ("Any", "Literal", "Annotated")})
    ns.update({k: getattr(pydantic, k) for k in ("BaseModel", "Field", "field_validator",
                                                  "model_validator", "NonNegativeInt",
                                                  "ConfigDict")})
    used = {n.id for c in classes for n in ast.walk(c) if isinstance(n, ast.Name)}
    for name in used - set(ns) - set(wanted) - set(dir(builtins)) - {"cls", "self", "v"}:
        ns[name] = type(name, (pydantic.BaseModel,), {"model_config": pydantic.ConfigDict(extra="allow")})
    exec(compile(ast.Module(body=classes, type_ignores=[]), str(path), "exec"), ns)  # noqa: S102
    for name in wanted:         # the names resolve in `ns`, not in a module pydantic can find
        ns[name].model_rebuild(_types_namespace=ns)
    return ns


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32])
def test_vllm_round_trip_is_exact(vllm_root, dtype):
    from vllm.utils.serial_utils import numpy2base64

    arr = routing(41).astype(dtype)
    b64 = numpy2base64(arr)
    theirs = np.load(io.BytesIO(base64.b64decode(b64)))     # the decoding protocol.py documents
    ours = decode_npy(b64, 41, SHAPE, "r")
    assert ours.dtype == theirs.dtype == dtype
    np.testing.assert_array_equal(ours, theirs)


def test_vllm_response_rows_through_its_protocol_classes(vllm_root):
    from vllm.utils.serial_utils import numpy2base64

    ns = vllm_response_classes(vllm_root)
    P, M = 12, 6
    arr = routing(P + M - 1, seed=3)
    resp = ns["GenerateTokensResponse"](
        request_id="r0", prompt_token_ids=list(range(P)),
        choices=[ns["GenerateTokensChoice"](index=0, token_ids=list(range(50, 50 + M)),
                                            routed_experts=numpy2base64(arr.astype(np.uint8)))])
    obj = json.loads(json.dumps(resp.model_dump()))     # as api_router's JSONResponse sends it
    spec = engine("vllm")
    rows = request_rows(spec, spec.parse(obj, "r"), SHAPE, np.dtype(np.uint8), "r",
                        prompt_ids=list(range(P)), start=0)
    np.testing.assert_array_equal(rows.experts, arr[:, 1:])
    assert rows.prompt_len == P and rows.position[-1] == P + M - 2


def test_vllm_request_fields_exist(vllm_root):
    body = engine("vllm").build([1, 2, 3], 4, 7)
    path = vllm_root / "entrypoints/scale_out/token_in_token_out/protocol.py"
    assert set(body) <= class_fields(path, "GenerateRequest")
    assert set(body["sampling_params"]) <= class_fields(vllm_root / "sampling_params.py",
                                                        "SamplingParams")


# ---- hostile payloads: refused before anything is allocated ---------------------------------

def npy_b64(arr, **kw) -> str:
    buf = io.BytesIO()
    np.save(buf, arr, **kw)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("payload, match", [
    (lambda: npy_b64(np.array([{"a": 1}], dtype=object), allow_pickle=True), "not a plain integer"),
    (lambda: npy_b64(routing(5).astype(np.float32)), "not a plain integer"),
    (lambda: npy_b64(np.asfortranarray(routing(5))), "Fortran"),
    (lambda: npy_b64(routing(5)[:, :3]), "model shape does not match"),
    (lambda: npy_b64(routing(6)), "holds 6 rows, expected 5"),
    (lambda: "not base64!", "not base64"),
    (lambda: base64.b64encode(b"\x93NUMPY\x01\x00" + (40).to_bytes(2, "little")
                              + b"{'descr': '<i4', 'fortran_order': False, 'shape': "
                                b"(10**12, 27, 6)}").decode(), "not a Python literal|shape"),
    (lambda: "A" * 10_000_000, "larger than"),
])
def test_vllm_hostile_payloads(payload, match):
    with pytest.raises(InputError, match=match):
        decode_npy(payload(), 5, SHAPE, "r")


def test_npy_header_claiming_a_huge_array_is_refused_without_allocating():
    header = b"{'descr': '<i4', 'fortran_order': False, 'shape': (1000000000000, 27, 6), }"
    raw = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 16
    with pytest.raises(InputError, match="rows"):
        decode_npy(base64.b64encode(raw).decode(), None, SHAPE, "r", max_rows=100)


@pytest.mark.parametrize("payload, match", [
    (lambda: base64.b64encode(routing(5).tobytes()[:-4]).decode(), "not a multiple"),
    (lambda: base64.b64encode(routing(4).tobytes()).decode(), "holds 4 rows, expected 5"),
    (lambda: "A" * 100_000, "larger than"),
    (lambda: 17, "not a base64 string"),
])
def test_sglang_hostile_payloads(payload, match):
    with pytest.raises(InputError, match=match):
        decode_sglang(payload(), 5, SHAPE, "r")


def test_ids_out_of_range_are_refused():
    arr = routing(5)
    arr[2, 4, 1] = 64
    spec = engine("sglang")
    resp = {"output_ids": [1, 2], "meta_info": {"prompt_tokens": 4, "completion_tokens": 2,
                                                "routed_experts": base64.b64encode(arr.tobytes()).decode()}}
    with pytest.raises(InputError, match="row 2 layer 4 slot 1: expert id 64 is outside 0..63"):
        request_rows(spec, spec.parse(resp, "r"), SHAPE, np.dtype(np.uint8), "r",
                     prompt_ids=[1, 2, 3, 4], start=0)


def test_dense_layer_junk_is_not_read():
    """The dense layer's column (-1 here) is dropped, not range-checked."""
    arr = routing(5)
    out = decode_sglang(base64.b64encode(arr.tobytes()).decode(), 5, SHAPE, "r")
    assert (out[:, 0] == -1).all()
    spec = engine("sglang")
    resp = {"output_ids": [1, 2], "meta_info": {"prompt_tokens": 4, "completion_tokens": 2,
                                                "routed_experts": base64.b64encode(arr.tobytes()).decode()}}
    rows = request_rows(spec, spec.parse(resp, "r"), SHAPE, np.dtype(np.uint8), "r",
                        prompt_ids=[1, 2, 3, 4], start=0)
    assert rows.experts.shape == (5, 26, 6)


def route_paths(path: Path) -> set[str]:
    """The string paths of the route decorators (`@app.api_route(...)`, `@router.post(...)`,
    `@app.get(...)`) in an engine's server source."""
    tree = ast.parse(path.read_text())
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in fn.decorator_list:
                if isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant) \
                        and isinstance(d.args[0].value, str):
                    out.add(d.args[0].value)
    return out


def test_the_endpoints_we_call_are_the_engines(sglang_codec, vllm_root):
    sglang_root, _, _ = sglang_codec
    sgl = route_paths(sglang_root / "srt/entrypoints/http_server.py")
    assert {engine("sglang").generate_path, "/server_info", "/model_info"} <= sgl
    vll = route_paths(vllm_root / "entrypoints/scale_out/token_in_token_out/api_router.py")
    assert engine("vllm").generate_path in vll
    assert "/version" in route_paths(vllm_root / "entrypoints/serve/instrumentator/basic.py")
