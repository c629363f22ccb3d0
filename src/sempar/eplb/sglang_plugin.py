"""SGLang 0.5.23 plug-in (entry point `sempar` in group `sglang.srt.plugins`).

SGLang runs `register()` in every process (`sglang.srt.plugins.load_plugins`), then applies
the registered hooks. With SEMPAR_EPLB set it registers an AROUND hook on
`sglang.srt.eplb.eplb_algorithms.rebalance_experts`, the policy entry that
`ExpertLocationMetadata.init_by_eplb` calls at every `EPLBManager.rebalance` (and for a
`--init-expert-location` given as logical counts): it returns sempar's map in that function's
format (physical_to_logical [L, P], logical_to_physical [L, N, X] padded with -1, counts
[L, N]); the original function's result whenever sempar cannot give one (one warning in
SGLang's logger). The old map is the one being served (`get_global_expert_location_metadata`).
SEMPAR_EPLB unset: nothing is registered. With elastic EP (`elasticity_aware` algorithms) the
hook passes through: SGLang's own policy knows which ranks are alive.
"""

from __future__ import annotations

import logging
import os

import numpy as np

logger = logging.getLogger("sglang.srt.eplb.sempar")
TARGET = "sglang.srt.eplb.eplb_algorithms.rebalance_experts"


def engine_format(phy2log: np.ndarray, N: int):
    """(physical_to_logical, logical_to_physical, logical_count) torch int64 tensors, as
    SGLang's `deepseek.rebalance_experts` returns them: a logical expert's physical slots in
    increasing slot order, padded with -1 to the largest copy count."""
    import torch

    L, P = phy2log.shape
    cnt = np.stack([np.bincount(r, minlength=N) for r in phy2log])
    X = int(cnt.max())
    log2phy = np.full((L, N, X), -1, np.int64)
    for l in range(L):
        order = np.argsort(phy2log[l], kind="stable")            # slots grouped by expert
        e = phy2log[l, order]
        start = np.concatenate([[0], np.cumsum(cnt[l])[:-1]])
        log2phy[l, e, np.arange(P) - start[e]] = order
    return (torch.from_numpy(phy2log.astype(np.int64)), torch.from_numpy(log2phy),
            torch.from_numpy(cnt.astype(np.int64)))


def _old_map(P: int):
    try:
        from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

        meta = get_global_expert_location_metadata()
        if meta is None:
            return None
        m = meta.physical_to_logical_map_cpu.numpy()
        return m if m.shape[-1] == P else None
    except Exception:  # noqa: BLE001 - no metadata yet (first call): lay out afresh
        return None


def _model() -> str | None:
    if os.environ.get("SEMPAR_EPLB_MODEL"):
        return os.environ["SEMPAR_EPLB_MODEL"]
    try:
        from sglang.srt.runtime_context import get_model

        return str(get_model().model_path)
    except Exception:  # noqa: BLE001
        return None


def around_rebalance(original, tokens_per_expert, num_physical_experts,
                     num_local_physical_experts, num_groups, num_nodes, algorithm):
    """The AROUND hook: sempar's map, or `original`'s result (module docstring)."""
    from sempar.eplb import engine

    def default():
        return original(tokens_per_expert=tokens_per_expert,
                        num_physical_experts=num_physical_experts,
                        num_local_physical_experts=num_local_physical_experts,
                        num_groups=num_groups, num_nodes=num_nodes, algorithm=algorithm)

    if str(getattr(algorithm, "name", "")).startswith("elasticity_aware"):
        return default()            # elastic EP: only SGLang knows which ranks are alive
    try:
        w = tokens_per_expert.float().cpu().numpy()
        if w.ndim == 3:                                   # [windows, L, N]: the window's sum
            w = w.sum(axis=0)
        G = num_physical_experts // num_local_physical_experts
        m = engine.plan(w, num_physical_experts, num_groups or 1, num_nodes, G,
                        _old_map(num_physical_experts), logger, model=_model(),
                        engine_name="sglang")
        if m is None:
            return default()
        return engine_format(m, w.shape[1])
    except Exception as err:  # noqa: BLE001 - never take the engine down
        logger.warning("sempar EPLB: using the engine's default policy for this rebalance: "
                       "%s: %s", type(err).__name__, err)
        return default()


def register() -> None:
    """SGLang's general-plugin hook: register the AROUND hook when SEMPAR_EPLB is set."""
    from sempar.eplb import engine

    if not engine.enabled():
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        if any(h is around_rebalance for _, h, _ in HookRegistry._hooks.get(TARGET, [])):
            return
        HookRegistry.register(TARGET, around_rebalance, HookType.AROUND)
        logger.info("sempar EPLB: SGLang's EPLB keeps the locality of %s",
                    os.environ.get("SEMPAR_EPLB"))
    except Exception as err:  # noqa: BLE001
        logger.warning("sempar EPLB: not installed, SGLang's own policy stays: %s: %s",
                       type(err).__name__, err)
