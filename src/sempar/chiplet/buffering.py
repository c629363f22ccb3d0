"""Token buffering with per-request QoS timers (FSE-DP §IV-A, §V-A Algorithm 2; ablation A5).

At every MoE layer boundary, after gating and before the layer's experts are scheduled, each request
r in the layer's batch is checked (Alg. 2):

- lines 2-5: when its forward-pass counter C_fw(r) reaches N_threshold the QoS timer T_QoS(r) gains
  one buffering opportunity and C_fw(r) restarts;
- lines 6-9: if one of its activated experts is cold (n_e < theta_min tokens over all active
  requests at this layer) and T_QoS(r) > 0, the whole request is deferred at this layer: its tokens
  skip the rest of this iteration and resume at the same layer in the next iteration, joining that
  iteration's batch; T_QoS(r) decreases.

Ours (the paper leaves them open): C_fw(r) counts the iterations in which r contributes tokens;
slack s (10/20/30% = "the fraction of an iteration that a request is allowed to be deferred")
gives N_threshold = round(1 / s), so a request may be deferred in at most a fraction s of its
forward passes; theta_min = 2 (an expert with a single token is "extremely cold"); the batch
assembly does not wait for deferred requests (the trace fixes every iteration's new tokens); the
deferred tokens left after the last iteration run in one flush iteration, so every token-layer
activation is computed exactly once.

On-chip memory: the rewritten batches run on flow.py's accounting (2 n a of tokens per instance);
a deferred request's activations stay on chip until it resumes, so simulate.py adds one copy of
the most tokens held at once (`BufferingLog.held_max` x a) to the peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sempar.chiplet.workload import Instances, Workload


@dataclass
class BufferingLog:
    """deferrals[r]: times request r was deferred; passes[r]: its forward passes (iterations with
    own tokens); held_max: the most tokens deferred at once; deadline_ok: every request stayed within
    its slack."""

    n_threshold: int
    held_max: int = 0
    deferrals: dict = field(default_factory=dict)
    passes: dict = field(default_factory=dict)

    @property
    def deadline_ok(self) -> bool:
        return all(self.deferrals.get(r, 0) <= p // self.n_threshold for r, p in self.passes.items())


def n_threshold(slack: float) -> int:
    return max(1, int(round(1.0 / slack)))


def buffered_instances(wl: Workload, slack: float, theta_min: int = 2) -> tuple[Instances, BufferingLog]:
    """Instances after Alg. 2 token buffering (module doc); the last iteration index is the flush."""
    L = wl.model.layers
    nth = n_threshold(slack)
    log = BufferingLog(nth)
    timer: dict[int, int] = {}
    cfw: dict[int, int] = {}
    E = wl.model.total_experts
    carried: list[tuple[int, np.ndarray, np.ndarray, int]] = []   # (request, urows, ctx, start layer)
    parts, reqs, ctxs, offs, lay, its = [], [], [], [0], [], []
    n_it = len(wl.iterations)
    for i in range(n_it + 1):
        groups = list(carried)
        carried = []
        if i < n_it:
            it = wl.iterations[i]
            for r in np.unique(it.request):
                sel = it.request == r
                r = int(r)
                groups.append((r, it.rows[sel], it.position[sel] + 1, 0))
                log.passes[r] = log.passes.get(r, 0) + 1
                cfw[r] = cfw.get(r, 0) + 1
                if cfw[r] >= nth:                                     # Alg. 2 lines 2-5
                    timer[r] = timer.get(r, 0) + 1
                    cfw[r] = 0
        elif not groups:
            break
        alive = [True] * len(groups)
        for layer in range(L):
            idx = [g for g in range(len(groups)) if alive[g] and groups[g][3] <= layer]
            if not idx:
                continue
            ex = [wl.layer_experts(groups[g][1], layer) for g in idx]
            n_e = np.bincount(np.concatenate(ex).ravel().astype(np.int64), minlength=E)
            keep = []
            for g, x in zip(idx, ex):
                r = groups[g][0]
                if i < n_it and timer.get(r, 0) > 0 and (n_e[x.astype(np.int64)] < theta_min).any():
                    timer[r] -= 1                                     # Alg. 2 lines 6-9
                    log.deferrals[r] = log.deferrals.get(r, 0) + 1
                    alive[g] = False
                    carried.append((r, groups[g][1], groups[g][2], layer))
                else:
                    keep.append((g, x))
            if not keep:
                continue
            parts.append(np.concatenate([x for _, x in keep]))
            reqs.append(np.concatenate([np.full(len(x), groups[g][0]) for g, x in keep]))
            ctxs.append(np.concatenate([groups[g][2] for g, _ in keep]))
            offs.append(offs[-1] + parts[-1].shape[0])
            lay.append(layer)
            its.append(i)
        log.held_max = max(log.held_max, sum(g[1].size for g in carried))
    inst = Instances(np.concatenate(parts), np.array(offs), np.concatenate(reqs), np.array(lay),
                     np.array(its), np.concatenate(ctxs), E)
    return inst, log
