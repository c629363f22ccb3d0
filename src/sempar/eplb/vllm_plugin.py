"""vLLM 0.33.0 plug-in (entry point `sempar` in group `vllm.general_plugins`).

vLLM runs `register()` in every process (`vllm.plugins.load_general_plugins`). With
SEMPAR_EPLB set, it puts a subclass of the policy under `EPLB_POLICIES["default"]` (the only
name `EPLBConfig.policy` accepts, and the one async EPLB requires): its `rebalance_experts`
returns sempar's map (`engine.plan`), and the original default policy's result whenever sempar
cannot give one (one warning in vLLM's logger). SEMPAR_EPLB unset: nothing is touched.
`EplbState` looks the policy up when it is built, after the plug-ins are loaded.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm.sempar_eplb")     # a child of vLLM's configured logger


def make_policy(base: type) -> type:
    """The policy class: `base`'s interface, sempar's map, `base`'s result on fallback."""
    import torch

    from sempar.eplb import engine

    class SemparEplbPolicy(base):
        sempar_base = base

        @classmethod
        def rebalance_experts(cls, weight, num_replicas, num_groups, num_nodes, num_ranks,
                              old_global_expert_indices=None):
            try:
                old = (None if old_global_expert_indices is None
                       else old_global_expert_indices.cpu().numpy())
                m = engine.plan(weight.float().cpu().numpy(), num_replicas, num_groups,
                                num_nodes, num_ranks, old, logger,
                                model=os.environ.get("SEMPAR_EPLB_MODEL") or None,
                                engine_name="vllm")
            except Exception as err:  # noqa: BLE001 - never take the engine down
                logger.warning("sempar EPLB: using the engine's default policy for this "
                               "rebalance: %s: %s", type(err).__name__, err)
                m = None
            if m is None:
                return base.rebalance_experts(weight, num_replicas, num_groups, num_nodes,
                                              num_ranks, old_global_expert_indices)
            return torch.from_numpy(m)

    SemparEplbPolicy.__qualname__ = SemparEplbPolicy.__name__ = "SemparEplbPolicy"
    return SemparEplbPolicy


def register() -> None:
    """vLLM's general-plugin hook: install the policy when SEMPAR_EPLB is set (idempotent)."""
    from sempar.eplb import engine

    if not engine.enabled():
        return
    try:
        from vllm.distributed.eplb import policy as policies

        base = policies.EPLB_POLICIES["default"]
        if getattr(base, "sempar_base", None) is not None:
            return                                         # loaded twice in this process
        policies.EPLB_POLICIES["default"] = make_policy(base)
        logger.info("sempar EPLB: the default EPLB policy keeps the locality of %s",
                    os.environ.get("SEMPAR_EPLB"))
    except Exception as err:  # noqa: BLE001
        logger.warning("sempar EPLB: not installed, vLLM's own policy stays: %s: %s",
                       type(err).__name__, err)
