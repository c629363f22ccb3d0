"""The engines' own placement loaders, loaded on a CPU machine for the conformance tests.

Pinned versions (the `engines` extra in pyproject.toml, installed by .ci/run with --no-deps):

- SGLang 0.5.23: `sglang/srt/eplb/expert_location.py` and `expert_location_dispatch.py` are
  imported as they are. At module level they import only torch and
  `sglang.srt.runtime_context` (process-wide server args / parallel state / device), which is
  replaced by a stub holding exactly what the launch flags set (`--ep-size`,
  `--ep-num-redundant-experts`, `--init-expert-location`, the dispatch algorithm SGLang derives);
  `sglang/__init__.py` (which starts the whole runtime) is bypassed by registering bare package
  modules. The model-side facts (rows = `num_hidden_layers`, which layers are sparse) come from
  SGLang's own `DeepseekV2ForCausalLM.get_model_config_for_expert_location` and
  `DeepseekV2DecoderLayer._is_layer_sparse`, compiled from the installed `models/deepseek_v2.py`
  (that module imports GPU kernels, so it is not imported whole).
- vLLM 0.33.0: `compute_logical_maps` compiled from the installed
  `vllm/distributed/eplb/eplb_state.py` (the module imports vLLM's CUDA platform at import time).
- vllm-ascend: `vllm_ascend.eplb.core.eplb_utils` imported when installed (it is not on x86-64:
  PyPI has no wheel for it and its sdist builds against torch-npu).

Every loader is looked up without importing the package's `__init__`; absent or another
version: `pytest.skip` with the reason.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any, Callable

import pytest

PINS = {"sglang": "0.5.23", "vllm": "0.33.0"}


def package_root(dist: str, top: str) -> Path:
    """The installed package folder at the pinned version, or pytest.skip saying why not."""
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed (pip install --no-deps {dist}=={PINS[dist]}: "
                    "the `engines` extra, which .ci/run installs)")
    if version != PINS[dist]:
        pytest.skip(f"conformance is pinned to {dist} {PINS[dist]}, found {version}")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{dist} {version}: package {top} not found")
    return Path(list(spec.submodule_search_locations)[0])


def compile_function(path: Path, qualname: str, namespace: dict[str, Any]) -> Callable:
    """Compile ONE function (`name` or `Class.method`) from an engine's source file, decorators
    dropped, in `namespace`; the rest of the file is not run."""
    tree = ast.parse(path.read_text(), str(path))
    parts = qualname.split(".")
    body = tree.body
    for part in parts[:-1]:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == part).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == parts[-1])
    fn.decorator_list = []
    module = ast.Module(body=[fn], type_ignores=[])
    ns = dict(namespace)
    exec(compile(module, str(path), "exec"), ns)  # noqa: S102 - the pinned engine's own code
    return ns[parts[-1]]


class SGLang:
    """SGLang's expert-location loader with a stubbed runtime context (module docstring)."""

    def __init__(self, root: Path):
        self.root = root
        self._saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
        for name, sub in (("sglang", ""), ("sglang.srt", "srt"), ("sglang.srt.eplb", "srt/eplb"),
                          ("sglang.srt.elastic_ep", "srt/elastic_ep")):
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(root / sub)]
            sys.modules[name] = pkg
        self.state = NS(
            exec=NS(moe=NS(ep_num_redundant_experts=0, ep_dispatch_algorithm="static",
                           moe_a2a_backend="deepep", ep_join_mode=None,
                           init_expert_location="trivial")),
            parallel=NS(ep_size=1, elastic_ep_initial_size=None, nnodes=1, tp_size=1,
                        ep_join_rank_offset=0),
            resources=NS(expert_location_metadata=None), device=NS(device="cpu"))
        rc = types.ModuleType("sglang.srt.runtime_context")
        rc.get_exec = lambda: self.state.exec
        rc.get_parallel = lambda: self.state.parallel
        rc.get_resources = lambda: self.state.resources
        rc.get_device = lambda: self.state.device
        sys.modules[rc.__name__] = rc
        # elastic EP (a later scale-up of the EP group) is off in a plain launch
        ee = types.ModuleType("sglang.srt.elastic_ep.elastic_ep")
        ee.elastic_expanded_world_enabled = lambda: False
        sys.modules[ee.__name__] = ee
        self.location = importlib.import_module("sglang.srt.eplb.expert_location")
        self.dispatch = importlib.import_module("sglang.srt.eplb.expert_location_dispatch")
        src = root / "srt" / "models" / "deepseek_v2.py"
        ns = {"ModelConfigForExpertLocation": self.location.ModelConfigForExpertLocation}
        self._config_for = compile_function(
            src, "DeepseekV2ForCausalLM.get_model_config_for_expert_location", ns)
        self.is_layer_sparse = compile_function(src, "DeepseekV2DecoderLayer._is_layer_sparse", {})

    def close(self) -> None:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(self._saved)

    def launch(self, flags: list[str], a2a: bool = True) -> None:
        """Set the runtime context as `sglang.launch_server <flags>` would."""
        def value(name: str) -> str:
            return flags[flags.index(name) + 1]

        G = int(value("--ep-size"))
        self.state.parallel.ep_size = self.state.parallel.tp_size = G
        moe = self.state.exec.moe
        moe.ep_num_redundant_experts = int(value("--ep-num-redundant-experts"))
        moe.init_expert_location = value("--init-expert-location")
        # SGLang's parallel_hook: static with an all-to-all backend, dynamic without one
        moe.moe_a2a_backend = "deepep" if a2a else "none"
        moe.ep_dispatch_algorithm = "static" if a2a else "dynamic"

    def load(self, hf_config: Any, rank: int) -> Any:
        """`compute_initial_expert_location_metadata` for one EP rank, set as the global one."""
        loc = self.location
        loc.ModelConfigForExpertLocation.from_model_config = staticmethod(
            lambda mc: self._config_for(None, mc.hf_config))
        md = loc.compute_initial_expert_location_metadata(NS(hf_config=hf_config), rank)
        self.state.resources.expert_location_metadata = md
        return md

    def moe_layers(self, hf_config: Any) -> list[int]:
        return [l for l in range(hf_config.num_hidden_layers)
                if self.is_layer_sparse(hf_config, l, False)]


def vllm_compute_logical_maps() -> Callable:
    root = package_root("vllm", "vllm")
    import torch

    return compile_function(root / "distributed" / "eplb" / "eplb_state.py",
                            "compute_logical_maps", {"torch": torch})


def vllm_ascend_eplb_utils() -> Any:
    if importlib.util.find_spec("vllm_ascend") is None:
        pytest.skip("vllm-ascend is not installed: PyPI has no x86-64 wheel of it and its sdist "
                    "builds against torch-npu (Ascend NPUs only)")
    try:
        return importlib.import_module("vllm_ascend.eplb.core.eplb_utils")
    except Exception as err:  # its imports need the NPU runtime
        pytest.skip(f"vllm_ascend.eplb.core.eplb_utils does not import here: {err}")
