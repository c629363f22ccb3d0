"""The engines' own balancers in `sempar replay`: each engine's default EPLB policy, called
through the engine's installed code as its balancer calls it, and the sempar plug-in called
through the same path (issue 43, item 3).

- `vllm-eplb`: vLLM 0.33.0 `EPLB_POLICIES["default"].rebalance_experts(weight [L, N],
  num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices [L, P])` ->
  `physical_to_logical_map` [L, P] (`vllm/distributed/eplb/eplb_state.py`, `rearrange`: the load
  window summed over its steps, `num_groups` the model's expert groups, the current map as the
  old one);
- `sglang-eplb`: SGLang 0.5.23 `eplb_algorithms.rebalance_experts(tokens_per_expert [B, L, N],
  num_physical_experts, num_local_physical_experts, num_groups, num_nodes,
  algorithm=compute_algorithm("auto", ...))` (`srt/eplb/expert_location.py`, `init_by_eplb`: no
  old map; the engine then copies only the slots that changed). SGLang's package does not import
  without triton (CPU machines): then its `deepseek.py`, which needs only torch, is loaded from
  the installed file and called as `rebalance_experts` dispatches `auto` to it (hierarchical
  when `num_groups` divides by `num_nodes`; `num_groups` None for models without groups);
- `sempar-engine`: `sempar.eplb.policy.rebalance` (the plug-in's engine-free core) with the
  same arguments, its locality source the last `--window` requests (what `sempar stats build`
  over a rolling window gives the plug-in as FILE).

No engine code is copied here: where an engine is not installed (the README's test command runs
without the `engines` extra), its policy is unavailable with a one-line reason (`unavailable`).

Cadence. An engine rebalances every `interval` forward passes from the loads of the last
`window` passes: vLLM `EPLBConfig.step_interval` 3000 / `window_size` 1000; SGLang
`--eplb-rebalance-num-iterations` 1000, its recorder buffer defaulting to the same 1000. The
replay's unit is a step of `--every` requests; `ReplayConfig.passes_per_step` (default 1000,
SGLang's interval) is the forward passes one step stands for. An engine policy updates before
step s > 0 when s x passes_per_step reaches a multiple of its interval (vLLM: every 3rd step,
SGLang: every step) from the last window x every / passes_per_step requests (both: one step's
requests). `sempar-engine` runs at the cadence of `ReplayConfig.engine`, the balancer it is
plugged into. The mapping keeps the engines' ratio of interval to window, not their wall time.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from sempar.placement.placement import Placement
from sempar.registry import Registry
from sempar.trace.schema import RoutingTrace


@dataclass(frozen=True)
class Cadence:
    """interval: forward passes between rebalances; window: forward passes of load it sees."""

    interval: int
    window: int
    source: str


CADENCES: Registry[Cadence] = Registry("engine")   # the balancers `sempar-engine` runs in
CADENCES.add("vllm", Cadence(3000, 1000, "vLLM 0.33.0 EPLBConfig: step_interval 3000, "
                                         "window_size 1000"))
CADENCES.add("sglang", Cadence(1000, 1000, "SGLang 0.5.23 --eplb-rebalance-num-iterations 1000 "
                                           "(the recorder buffer defaults to it)"))


def updates_at(cadence: Cadence, step: int, passes_per_step: int) -> bool:
    """Whether a policy at `cadence` rebalances before replay step `step` (> 0)."""
    if step <= 0:
        return False
    every = max(1, round(cadence.interval / passes_per_step))
    return step % every == 0


def window_requests(cadence: Cadence, every: int, passes_per_step: int) -> int:
    """Requests of load the engine's window holds: window / passes_per_step steps of `every`."""
    return max(1, round(cadence.window / passes_per_step * every))


def expert_load(trace: RoutingTrace) -> np.ndarray:
    """int64[L, N]: activations of each logical expert in `trace` (the engines' load window:
    vLLM's summed `expert_load_window`, SGLang's recorder `logical_count` summed over its buffer)."""
    T, L, k = trace.experts.shape
    N = trace.meta.num_experts
    key = np.arange(L)[None, :, None] * N + trace.experts.astype(np.int64)
    return np.bincount(key.ravel(), minlength=L * N).reshape(L, N)


def _groups(trace: RoutingTrace) -> int:
    return max(1, int(trace.meta.num_expert_groups or 1))


# ------------------------------------------------------------------ vLLM

@functools.lru_cache(maxsize=None)
def _vllm_policy():
    from vllm.distributed.eplb.policy import EPLB_POLICIES

    return EPLB_POLICIES["default"]


def vllm_unavailable() -> str | None:
    """Why `vllm-eplb` cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm-eplb: vLLM is not installed (pip install 'sempar[engines]')"
    try:
        _vllm_policy()
    except Exception as e:              # an engine that does not import: its reason, one line
        return f"vllm-eplb: vLLM's EPLB policy does not import here ({type(e).__name__}: {e})"
    return None


def vllm_map(weight: np.ndarray, current: Placement, num_groups: int) -> np.ndarray:
    """int64[L, P]: vLLM's default policy's map, called as `EplbState.rearrange` calls it."""
    import torch

    G = current.num_devices
    out = _vllm_policy().rebalance_experts(torch.from_numpy(weight.astype(np.int64)),
                                           current.num_slots, num_groups, current.num_nodes, G,
                                           torch.from_numpy(current.phy2log.astype(np.int64)))
    return out.cpu().numpy().astype(np.int64)


# ------------------------------------------------------------------ SGLang

@functools.lru_cache(maxsize=None)
def _sglang_algorithms():
    """(rebalance_experts(tokens_per_expert, num_physical, num_local_physical, num_groups,
    num_nodes) -> (phy2log, log2phy, logcnt), how it was reached)."""
    try:
        algo = importlib.import_module("sglang.srt.eplb.eplb_algorithms")

        def call(tpe, P, S, num_groups, num_nodes):
            return algo.rebalance_experts(
                tokens_per_expert=tpe, num_physical_experts=P, num_local_physical_experts=S,
                num_groups=num_groups, num_nodes=num_nodes,
                algorithm=algo.compute_algorithm("auto", num_groups, num_nodes))

        return call, "sglang.srt.eplb.eplb_algorithms"
    except ImportError:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise
        path = os.path.join(list(spec.submodule_search_locations)[0], "srt", "eplb",
                            "eplb_algorithms", "deepseek.py")
        fspec = importlib.util.spec_from_file_location("_sempar_sglang_eplb_deepseek", path)
        mod = importlib.util.module_from_spec(fspec)
        fspec.loader.exec_module(mod)

        def call(tpe, P, S, num_groups, num_nodes):
            # `compute_algorithm("auto")`: hierarchical when the groups divide over the nodes
            hier = num_groups is not None and num_groups % num_nodes == 0
            return mod.rebalance_experts(weight=tpe.sum(dim=0), num_replicas=P,
                                         num_groups=num_groups, num_nodes=num_nodes,
                                         num_gpus=P // S, enable_hierarchical=hier)

        return call, path


def sglang_unavailable() -> str | None:
    """Why `sglang-eplb` cannot run here, or None."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang-eplb: SGLang is not installed (pip install 'sempar[engines]')"
    try:
        _sglang_algorithms()
    except Exception as e:
        return f"sglang-eplb: SGLang's EPLB algorithms do not load here ({type(e).__name__}: {e})"
    return None


def sglang_map(weight: np.ndarray, current: Placement, num_groups: int | None) -> np.ndarray:
    """int64[L, P]: SGLang's default policy's `physical_to_logical_map`, as `init_by_eplb`
    calls it (a window of one buffer entry: the loads summed)."""
    import torch

    call = _sglang_algorithms()[0]
    phy2log = call(torch.from_numpy(weight.astype(np.int64))[None], current.num_slots,
                   current.slots_per_device, num_groups, current.num_nodes)[0]
    return phy2log.cpu().numpy().astype(np.int64)


# ------------------------------------------------------------------ sempar plug-in

def sempar_unavailable() -> str | None:
    """Why `sempar-engine` cannot run here, or None."""
    try:
        for mod in ("sempar.eplb.policy", "sempar.eplb.source", "sempar.eplb.engine"):
            importlib.import_module(mod)
    except ImportError as e:
        return f"sempar-engine: the plug-in core sempar.eplb.policy is not importable ({e})"
    return None


def window_source(window: RoutingTrace, sample_rows: int = 4096):
    """The plug-in's FILE for one rebalance, in memory: the rolling window's statistics with
    its rows as the `sample` part (what `sempar stats build --parts sample` over the window
    writes), read by the plug-in's own `source_from_stats` (co-activation from the sample)."""
    from types import SimpleNamespace

    from sempar.eplb.source import source_from_stats

    st = SimpleNamespace(meta=window.meta, sample={"experts": window.experts},
                         coactivation=None)
    return source_from_stats(st, "<replay window>", sample_rows=sample_rows)


def plugin_config(knobs: tuple[tuple[str, str], ...], engine: str = ""):
    """The plug-in's `PluginConfig` in `engine` with `knobs` (field, value) read as the plug-in
    reads SEMPAR_EPLB_<FIELD> (`PluginConfig.from_env`; a bad value is bad input, one line)."""
    from sempar.eplb.config import ENV_PREFIX, PluginConfig

    return PluginConfig.from_env({ENV_PREFIX + k.upper(): v for k, v in knobs}, engine=engine)


def sempar_map(weight: np.ndarray, current: Placement, num_groups: int,
               window: RoutingTrace, default, seed: int = 0,
               engine: str = "", knobs: tuple[tuple[str, str], ...] = ()
               ) -> tuple[np.ndarray, str | None]:
    """(int64[L, P], fallback reason or None): the plug-in's map for this rebalance, called as
    `sempar.eplb.engine.plan` does (`engine.checked_map` on the engine's arguments, FILE from
    `window_source`, the plug-in's config: its defaults in `engine`, `knobs` (field, value)
    read as `PluginConfig.from_env` reads SEMPAR_EPLB_<FIELD>), or, where the plug-in would
    fall back, `default()` (the host engine's own result) and the one-line reason."""
    from dataclasses import replace

    from sempar.eplb.engine import checked_map, fallback_reason

    try:
        cfg = replace(plugin_config(knobs, engine), seed=seed)
        m, _ = checked_map(weight.astype(np.float64), current.num_slots, num_groups,
                           current.num_nodes, current.num_devices,
                           current.phy2log.astype(np.int64),
                           window_source(window, cfg.sample_rows()), cfg)
        return np.asarray(m, np.int64), None
    except Exception as err:  # noqa: BLE001 - the plug-in never takes the engine down
        return default(), fallback_reason(err)


def as_placement(phy2log: np.ndarray, current: Placement, method: str) -> Placement:
    """The engine's map as a `Placement` on `current`'s devices. Not validated: DeepSeek EPLB's
    packing may put two copies of an expert on one device, and the engines serve that map."""
    return Placement(np.asarray(phy2log, np.int32), current.num_experts, current.num_devices,
                     current.node_of.copy(), method, {"engine_map": True})
