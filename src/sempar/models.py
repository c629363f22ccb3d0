"""Models by name or folder: the packaged models (`assets/models/<name>`), their tokenizers, and
loading a Hugging Face transformers model offline (safetensors, `local_files_only`).

Low in the layering (errors, paths, atomic only; torch / transformers / tokenizers imported when
a model is loaded), so `trace.record`, `runtime`, `routing` and `schedule` all load models here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sempar.errors import InputError, check_choice
from sempar.native_path import utf8_path
from sempar.paths import assets_dir

ASSETS_DIR = assets_dir()
MODELS_DIR = ASSETS_DIR / "models"
DTYPES = ("float32", "bfloat16", "float16")


def known_models() -> list[str]:
    """Names of the models shipped in the package (`assets/models/<name>/config.json`)."""
    if not MODELS_DIR.is_dir():
        return []
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())


@dataclass(frozen=True)
class ModelSource:
    name: str
    model_dir: Path
    tokenizer_path: Path


def resolve_model(name_or_dir: str | os.PathLike) -> ModelSource:
    """A model folder, or the name of a packaged model (`tiny-moe64` -> assets/models/tiny-moe64).

    The tokenizer is the folder's own `tokenizer.json`, else the package's
    `assets/tokenizer.json`. Raises `InputError` naming the known models when nothing matches.
    """
    arg = str(name_or_dir)
    p = Path(arg)
    if p.is_dir():
        model_dir, name = p, p.resolve().name
    elif arg and "/" not in arg and "\\" not in arg and (MODELS_DIR / arg).is_dir():
        model_dir, name = MODELS_DIR / arg, arg
    else:
        known = known_models()
        raise InputError(f"--model {arg}: no such folder and not a known model name "
                         f"(known: {', '.join(known) if known else 'none installed'})")
    if not (model_dir / "config.json").is_file():
        raise InputError(f"--model {arg}: {model_dir} has no config.json")
    from sempar.atomic import register_input

    register_input(model_dir)
    for tok in (model_dir / "tokenizer.json", ASSETS_DIR / "tokenizer.json"):
        if tok.is_file():
            return ModelSource(name, model_dir, tok)
    raise InputError(f"--model {arg}: no tokenizer.json in {model_dir} nor in {ASSETS_DIR}")


def load_model(name_or_dir: str | os.PathLike, dtype: str = "float32") -> Any:
    """Load a model folder (config.json + safetensors) offline with AutoModelForCausalLM."""
    check_choice("--dtype", dtype, DTYPES)
    src = resolve_model(name_or_dir)
    if not any(src.model_dir.glob("*.safetensors")):
        raise InputError(f"--model {name_or_dir}: {src.model_dir} has no .safetensors weights")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with utf8_path(src.model_dir) as folder:    # safetensors takes UTF-8 names only
            model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                         dtype=getattr(torch, dtype))
    except Exception as err:  # noqa: BLE001 - transformers/safetensors raise many kinds
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"--model {name_or_dir}: {src.model_dir} cannot be loaded "
                         f"({type(err).__name__}: {reason[:200]})") from None
    model.eval()
    return model


class FileTokenizer:
    """A `tokenizers.Tokenizer` from a tokenizer.json, encoding without special tokens."""

    def __init__(self, path: str | os.PathLike):
        from tokenizers import Tokenizer

        try:
            with utf8_path(path) as name:
                self.tokenizer = Tokenizer.from_file(name)
        except Exception as err:  # tokenizers raises a bare Exception on bad JSON
            raise InputError(f"{path}: not a readable tokenizer.json "
                             f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
        self.path = Path(path)

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)


def load_tokenizer(path: str | os.PathLike) -> FileTokenizer:
    """The tokenizer of a model folder or name (see `resolve_model`), or a tokenizer.json file."""
    p = Path(path)
    if p.is_file():
        return FileTokenizer(p)
    return FileTokenizer(resolve_model(path).tokenizer_path)


SAFETENSORS_INDEX = "model.safetensors.index.json"


def checkpoint_shards(model_dir: str | os.PathLike) -> tuple[list[Path], dict[str, Path] | None]:
    """(shard files, {tensor name: shard file} or None) of a safetensors checkpoint folder: the
    shards its `model.safetensors.index.json` names (each must exist) with its weight map, or
    every `*.safetensors` file and None when there is no index.

    An index is user content: a shard name that resolves outside `model_dir` ("../../x", an
    absolute path, a symlink leading out) is refused before any shard is opened; so is a
    `*.safetensors` symlink leading out of the folder."""
    from sempar.safe_json import read_json_object

    d = Path(model_dir)
    index = d / SAFETENSORS_INDEX
    if not index.is_file():
        files = sorted(d.glob("*.safetensors"))
        if not files:
            raise InputError(f"{d}: no .safetensors files")
        for f in files:
            _check_inside(d, f.name, d)
        return files, None
    weight_map = read_json_object(index, "safetensors index").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise InputError(f"{index}: weight_map is not a non-empty object of tensor name -> "
                         "shard file name")
    names = sorted(set(weight_map.values()))
    for name in names:
        _check_inside(d, name, index)
        if not (d / name).is_file():
            raise InputError(f"{index}: names shard {name}, which is not in {d}")
    return [d / n for n in names], {k: d / n for k, n in weight_map.items()}


def _check_inside(model_dir: Path, name: str, where: Path) -> None:
    """Refuse shard `name` of `model_dir` unless it resolves to a path inside the folder."""
    p = Path(name)
    if p.is_absolute() or ".." in p.parts or "\0" in name or \
            not (model_dir / p).resolve().is_relative_to(model_dir.resolve()):
        shown = name.encode("unicode_escape").decode("ascii")
        raise InputError(f"{where}: shard {shown!r} lies outside the model folder {model_dir}")
