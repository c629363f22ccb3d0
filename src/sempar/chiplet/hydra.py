"""Hydra-style expert relocation for the EP baseline (FSE-DP §VI-A, its ref. [17]).

The paper isolates Hydra's EP optimisation: "it exploits cross-layer expert popularity to relocate
experts and reduce inter-chiplet communication". Ours:

- a profile of the workload gives, per model layer, the popularity of every expert (token count)
  and the co-activation C_l[e', e] of expert e' at layer l-1 with e at layer l;
- layer 0 is placed by longest-processing-time balancing of popularity (equal expert counts per die);
- layer l places experts by decreasing popularity on the die whose layer-(l-1) experts send it the
  most co-activated tokens, among dies with a free slot and popularity load within 10% of the mean
  (else the least loaded die with a free slot);
- a token's home at layer l is the die hosting most of its experts at layer l-1 (its hidden state
  stays there after the combine), so co-located experts keep tokens on one die.

The profile is the first 20% of the iterations (docs/design.md's fit/evaluate split; in-sample for
those). Relocation happens between iterations and is not charged. `hydra` runs on the paper's EP
(one whole expert per die), `hydra-db` on ours with double buffering (ep.py).

On-chip memory: ep.py's accounting under this placement, min(active experts of die d, buffers) x W
per die plus (n + copies + n K) x a tokens; relocation changes only which dies hold which experts
and how many token copies are replicated (co-located experts need none), never the weights per die
beyond the buffers.
"""

from __future__ import annotations

import numpy as np

from sempar.chiplet.workload import Instances


def hydra_placement(inst: Instances, layers: int, dies: int, slack: float = 0.10,
                    profile_fraction: float = 0.2) -> np.ndarray:
    """die_of int64[layers, E] from the popularity and cross-layer co-activation of the first
    `profile_fraction` of the iterations of `inst` (at least one).

    Needs instances whose consecutive layers list the same tokens in the same order
    (plain_instances)."""
    E, D = inst.num_experts, dies
    cap = -(-E // D)
    sizes = inst.sizes()
    b_of = np.repeat(np.arange(inst.B), sizes)
    lay = inst.layer[b_of]
    ex = inst.experts.astype(np.int64)
    K = ex.shape[1]
    n_prof = max(1, int(round((inst.iteration.max() + 1) * profile_fraction)))
    prof = inst.iteration[b_of] < n_prof
    pop = np.bincount((np.repeat(lay[prof], K) * E + ex[prof].ravel()),
                      minlength=layers * E).reshape(layers, E).astype(np.float64)
    # co-activation: row r at layer l pairs with the same token's row at layer l-1
    key = {(int(i), int(l)): b for b, (i, l) in enumerate(zip(inst.iteration, inst.layer))}
    co = np.zeros((layers, E, E))
    for b in range(inst.B):
        i, l = int(inst.iteration[b]), int(inst.layer[b])
        pb = key.get((i, l - 1))
        if i >= n_prof or pb is None or sizes[pb] != sizes[b]:
            continue
        cur = ex[inst.offsets[b]:inst.offsets[b + 1]]
        prev = ex[inst.offsets[pb]:inst.offsets[pb + 1]]
        a = np.repeat(prev, K, axis=1).ravel()
        c = np.tile(cur, (1, K)).ravel()
        co[l] += np.bincount(a * E + c, minlength=E * E).reshape(E, E)
    die_of = np.zeros((layers, E), np.int64)
    for l in range(layers):
        load = np.zeros(D)
        used = np.zeros(D, np.int64)
        target = pop[l].sum() / D * (1 + slack)
        for e in np.argsort(-pop[l], kind="stable"):
            free = used < cap
            if l == 0:
                d = int(np.argmin(np.where(free, load, np.inf)))
            else:
                aff = np.bincount(die_of[l - 1], weights=co[l][:, e], minlength=D)
                ok = free & (load + pop[l, e] <= target)
                if ok.any():
                    d = int(np.argmax(np.where(ok, aff - 1e-9 * load, -np.inf)))
                else:
                    d = int(np.argmin(np.where(free, load, np.inf)))
            die_of[l, e] = d
            load[d] += pop[l, e]
            used[d] += 1
    return die_of


def hydra_homes(inst: Instances, die_of: np.ndarray, dies: int) -> np.ndarray:
    """int64[sum n_b]: home die of each token row: even shard at layer 0 (and whenever the previous
    layer's instance is missing), else the die hosting most of its layer-(l-1) experts."""
    home = inst.home(dies)
    key = {(int(i), int(l)): b for b, (i, l) in enumerate(zip(inst.iteration, inst.layer))}
    sizes = inst.sizes()
    for b in range(inst.B):
        i, l = int(inst.iteration[b]), int(inst.layer[b])
        pb = key.get((i, l - 1))
        if pb is None or sizes[pb] != sizes[b]:
            continue
        prev = inst.experts[inst.offsets[pb]:inst.offsets[pb + 1]].astype(np.int64)
        d = die_of[l - 1][prev]                                  # int64[n, K]
        n = prev.shape[0]
        cnt = np.bincount((np.arange(n)[:, None] * dies + d).ravel(),
                          minlength=n * dies).reshape(n, dies)
        home[inst.offsets[b]:inst.offsets[b + 1]] = cnt.argmax(axis=1)
    return home
