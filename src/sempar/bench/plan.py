"""What `sempar bench` runs: its methods (placement, runtime mode, scheduling), the RunSpecs of a
benchmark, and the comm simulator's prediction for each run.

| name | placement | runtime mode | scheduling |
| --- | --- | --- | --- |
| `vanilla` | contiguous experts | attn-dp | requests round-robin |
| `vanilla-tp` | contiguous experts | tp-allreduce | contiguous chunks |
| `exflow` | exflow (ILP) | exflow | requests round-robin |
| `sempar-dp` | semmoe | attn-dp | requests by Sem-MoE Alg. 2 |
| `sempar-tp` | semmoe | tp-rebatch | targets from `OnlineScheduler.predict` |
| `sempar-tp-exact` | semmoe | tp-exact | exact pre-routing (`schedule.prerouter`) |

A method's simulator pipeline is its runtime mode's (`runtime.modes.DISPATCHERS`): bench and
the simulator read one table. `vanilla` (attention DP + EP, SGLang's default) is the baseline of
every time ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sempar.bench.inputs import batch_trace, load_dev, reference, tp_ok
from sempar.registry import Registry
from sempar.runtime.modes import DISPATCHERS
from sempar.solve_options import SolveOptions


@dataclass(frozen=True)
class Method:
    """placement: solver name; mode: runtime mode; scheduling: round-robin | contiguous | alg2 |
    online | exact."""

    placement: str
    mode: str
    scheduling: str

    @property
    def pipeline(self) -> str:
        return DISPATCHERS.get(self.mode).pipeline

    @property
    def tensor_parallel(self) -> bool:
        return DISPATCHERS.get(self.mode).tensor_parallel


METHODS: Registry[Method] = Registry("bench method")
for _name, _m in (("vanilla", Method("vanilla", "attn-dp", "round-robin")),
                  ("vanilla-tp", Method("vanilla", "tp-allreduce", "contiguous")),
                  ("exflow", Method("exflow", "exflow", "round-robin")),
                  ("sempar-dp", Method("semmoe", "attn-dp", "alg2")),
                  ("sempar-tp", Method("semmoe", "tp-rebatch", "online")),
                  ("sempar-tp-exact", Method("semmoe", "tp-exact", "exact"))):
    METHODS.add(_name, _m)
BASELINE = "vanilla"


def _uniform(G: int):
    from sempar.comm.topology import Topology

    return Topology("uniform", np.zeros(G, np.int32), np.zeros((G, G)),
                    np.ones((G, G)) - np.eye(G))


def predicted(spec, experts: np.ndarray, hidden: int) -> tuple[float, float, float, float]:
    """(dispatch bytes, combine bytes, LAR mean, pre-routing all-reduce bytes) of the comm
    simulator for the run: its mode's pipeline and home rule (`DISPATCHERS`)."""
    from sempar.comm.pipelines import PIPELINES
    from sempar.comm.simulate import runtime_options, simulate

    mode = DISPATCHERS.get(spec.mode)
    res = simulate(experts, mode.homes(spec, experts), spec.placement,
                   _uniform(spec.placement.num_devices), PIPELINES.get(mode.pipeline),
                   runtime_options(hidden, experts.shape[0]))
    bpp = res["bytes_per_pair"]
    return (float(bpp[:, 1].sum()), float(bpp[:, 2].sum()), float(res["total"]["lar_mean"]),
            float(res["total"]["bytes_prerouting"]))


def plan_specs(G: int, batches: list[torch.Tensor], methods: list[str], model: str,
               repeats: int = 3, timeout: float = 60.0, progress=None,
               options: SolveOptions | None = None):
    """(specs, per-spec context {"method", "batch", "experts", "logits"}, fitted placements,
    skipped {method: why}) of a benchmark: placements and online schedulers fitted on the dev
    trace's fit split, one RunSpec per (batch, method); `options`: the solve options, passed
    whole to every placement solve (None: the defaults)."""
    from sempar.placement import solve
    from sempar.runtime.run import RunSpec
    from sempar.schedule.online import OnlineScheduler, model_embedding

    say = progress or (lambda s: None)
    fit, _ = load_dev(model)
    skipped = {}
    if not tp_ok(model, G):
        for m in methods:
            if METHODS.get(m).tensor_parallel:
                skipped[m] = f"{model}'s attention heads do not split over {G} ranks"
    methods = [m for m in methods if m not in skipped]
    placements, scheds = {}, {}
    for m in methods:
        solver = METHODS.get(m).placement
        if solver not in placements:
            say(f"placement {solver} at G={G}")
            placements[solver] = solve(solver, fit, num_devices=G, options=options)
        if METHODS.get(m).scheduling in ("alg2", "online") and solver not in scheds:
            say(f"online schedulers for {solver}")
            scheds[solver] = OnlineScheduler(oov=model_embedding(model)).fit(fit,
                                                                             placements[solver])
    specs, ctx = [], []
    for bi, ids in enumerate(batches):
        logits, experts = reference(model, ids)
        tr = batch_trace(fit.meta, ids, experts)
        B = ids.shape[0]
        for m in methods:
            meth = METHODS.get(m)
            solver, policy = meth.placement, meth.scheduling
            rr, targets, prio = torch.arange(B) % G, None, None
            if policy == "alg2":
                # batch_trace's request b is row b, so arrival order is row order
                rr = torch.from_numpy(scheds[solver].request_ranks(tr, "alg2").astype(np.int64))
            elif policy == "online":
                dev, conf = scheds[solver].predict(tr)
                targets = torch.from_numpy(np.ascontiguousarray(dev.T).astype(np.int64))
                prio = torch.from_numpy(np.ascontiguousarray(conf.T).astype(np.float32))
            specs.append(RunSpec(model, ids, placements[solver], meth.mode, request_rank=rr,
                                 targets=targets, priority=prio, timeout=timeout,
                                 repeats=repeats))
            ctx.append({"method": m, "batch": bi, "experts": experts, "logits": logits})
    return specs, ctx, placements, skipped
