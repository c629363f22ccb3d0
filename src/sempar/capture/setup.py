"""Everything `sempar capture` settles before its first generate request: the engine's version
(its payload format must be one we know), whether the server returns routed experts at all
(when its info says), the model's shape (from `--model-dir`, else from the folder the server
reports it loaded, when that folder is on this machine) and the tokenised prompts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from sempar.capture.client import ClientConfig, EngineClient
from sempar.capture.engines import EngineSpec, engine
from sempar.errors import InputError

# Endpoints telling the folder the server loaded: SGLang's /model_info "model_path", vLLM's
# (OpenAI) /v1/models "data"[0]["root"].
MODEL_PATHS = (("/model_info", ("model_path",)), ("/get_model_info", ("model_path",)),
               ("/v1/models", ("data", 0, "root")))


def _dig(obj: Any, keys: tuple) -> Any:
    for k in keys:
        if isinstance(k, int):
            obj = obj[k] if isinstance(obj, list) and len(obj) > k else None
        else:
            obj = obj.get(k) if isinstance(obj, dict) else None
    return obj


async def _probe(spec: EngineSpec, url: str, config: ClientConfig) -> dict[str, Any]:
    """{version, flag, model_path} as far as the server's info endpoints tell (None: unknown).
    The first GET also tells whether the server answers at all (InputError when not)."""
    found: dict[str, Any] = {"version": None, "flag": None, "model_path": None}
    async with EngineClient(url, config) as client:
        for path in spec.version_paths:
            info = await client.get_json(path)
            if isinstance(info, dict):
                if found["flag"] is None:
                    found["flag"] = spec.flag_check(info)
                if isinstance(info.get("version"), str) and found["version"] is None:
                    found["version"] = info["version"]
            if found["version"] is not None:
                break
        for path, keys in MODEL_PATHS:
            v = _dig(await client.get_json(path), keys)
            if isinstance(v, str) and v:
                found["model_path"] = v
                break
    return found


def probe_server(engine_name: str, url: str, config: ClientConfig) -> dict[str, Any]:
    """Check the server before any generate request: refuse an unknown payload format version
    and a server whose info says routed-expert return is off."""
    spec = engine(engine_name)
    EngineClient(url, config)                           # the URL's scheme, checked first
    found = asyncio.run(_probe(spec, url, config))
    v = found["version"]
    if v is not None and not spec.known_version(v):
        raise InputError(f"{url}: {spec.name} {v}: its routed-expert format is not one sempar "
                         f"knows (known: {', '.join(p + '.x' for p in spec.versions)})")
    if found["flag"] is False:
        raise InputError(f"{url}: the {spec.name} server was started without {spec.flag}: it "
                         "returns no routed experts")
    return found


def model_shape(model_dir: str | os.PathLike | None, server_path: str | None
                ) -> tuple[str, dict[str, Any], Any]:
    """(model name, hf_config.config_shape of its config.json, tokenizer or None)."""
    from sempar.models import FileTokenizer, resolve_model
    from sempar.trace.hf_config import config_shape

    if model_dir is None:
        if server_path is None or not (Path(server_path) / "config.json").is_file():
            raise InputError("--model-dir: needed (the model's config.json gives its layers "
                             "and experts; the server does not report a folder on this machine"
                             f"{'' if server_path is None else ': ' + server_path[:120]})")
        model_dir = server_path
    source = resolve_model(model_dir)
    shape = config_shape(source.model_dir)
    for key in ("top_k", "vocab_size", "num_hidden_layers", "layer_ids"):
        if key not in shape:
            raise InputError(f"{source.model_dir}/config.json: no {key} (needed to read the "
                             "routed-expert payload)")
    if not shape["layer_ids"]:
        raise InputError(f"{source.model_dir}/config.json: no MoE layer")
    own = source.model_dir / "tokenizer.json"      # never the package's: another model's ids
    tokenizer = FileTokenizer(own) if own.is_file() else None
    return source.name, shape, tokenizer
