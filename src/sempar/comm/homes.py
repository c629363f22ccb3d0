"""Where each token sits per layer (its home) for a pipeline, placement and scheduling choice.

- attention TP (`ds-moe`, `smoe`): contiguous equal chunks of every batch (vanilla TP), or with
  the online schedulers the chunk the token is re-batched into (Sem-MoE Alg. 3 / s-MoE Alg. 2:
  `OnlineScheduler.home_tp`). `ds-moe` never re-batches (DeepSpeed-MoE has no scheduler).
- attention DP (`attn-dp`, `sglang-ep`, `exflow`'s first layer): requests dealt round-robin to
  the DP ranks in arrival order, or with the online schedulers by a request policy
  (`OnlineScheduler.home_dp`, Sem-MoE Alg. 2 by default).

- `smoe-exact`: the capacity-aligned home of each token's pre-routed experts (its real ones:
  `schedule.homes.oracle_home`, the pre-router's rule), whatever `schedule` says: nothing is
  predicted or fitted.

`schedule`: "auto" (default) uses the online schedulers when the placement carries a token
table, i.e. comes from a co-clustering method (semmoe, smoe-cem), and vanilla homes otherwise;
"online" fits them for any placement; "none" always uses the vanilla homes. The schedulers are
fitted on the fit split only (never on the trace being simulated).
"""

from __future__ import annotations

import numpy as np

from sempar.comm.pipelines import Pipeline
from sempar.errors import InputError
from sempar.placement.capacity import BATCH
from sempar.placement.placement import Placement
from sempar.schedule.homes import home_dp_round_robin, home_tp_contiguous, oracle_home
from sempar.trace.schema import RoutingTrace

SCHEDULES = ("auto", "online", "none")


class Homes:
    """Caches the fitted schedulers and the homes of one (placement, eval trace) pair."""

    def __init__(self, placement: Placement, eval_: RoutingTrace, fit: RoutingTrace | None,
                 schedule: str = "auto", policy: str = "alg2", batch: int = BATCH):
        if schedule not in SCHEDULES:
            raise InputError(f"--schedule: {schedule!r} is not one of {', '.join(SCHEDULES)}")
        self.placement, self.eval, self.fit = placement, eval_, fit
        self.schedule, self.policy, self.batch = schedule, policy, batch
        self._sched = None
        self._cache: dict[str, np.ndarray] = {}

    def scheduled(self, pipeline: Pipeline) -> bool:
        if pipeline.name == "smoe-exact":
            return True
        if not pipeline.scheduled or self.schedule == "none":
            return False
        return self.schedule == "online" or self.placement.token_table is not None

    def _scheduler(self):
        if self._sched is None:
            from sempar.schedule.online import OnlineScheduler, model_embedding

            if self.fit is None:
                raise InputError("online scheduling needs a fit split of the trace")
            self._sched = OnlineScheduler(oov=model_embedding(self.eval.meta.model),
                                          batch=self.batch).fit(self.fit, self.placement)
        return self._sched

    def __call__(self, pipeline: Pipeline) -> np.ndarray | None:
        """int32[T, L] homes for `pipeline`, None when it has no expert parallelism."""
        if not pipeline.expert_parallel:
            return None
        if pipeline.name == "smoe-exact":
            if "exact" not in self._cache:
                self._cache["exact"] = oracle_home(self.placement, self.eval.experts, self.batch)
            return self._cache["exact"]
        sched = self.scheduled(pipeline)
        key = f"{pipeline.attention}:{sched}"
        if key not in self._cache:
            T, L = self.eval.num_tokens, self.eval.meta.num_layers
            G = self.placement.num_devices
            if sched:
                home = self._scheduler().home(self.eval, pipeline.attention, self.policy)
            elif pipeline.attention == "tp":
                home = home_tp_contiguous(T, G, L, self.batch)
            else:
                home = home_dp_round_robin(self.eval.request_id, G, L)
            self._cache[key] = np.asarray(home, np.int32)
        return self._cache[key]
