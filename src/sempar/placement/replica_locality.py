"""Locality of replica slots: how many activations a retargeted replica slot would serve on
their home device (issue 45, item 3: sempar-incremental's replica slots for locality as well as
load).

Why: under a balancing dispatch that keeps activations home first (`lp-cap`), a second copy of
an expert is worth locality too: a token whose home device holds the copy is served there. On
the MMLU drift stream at EP 8 (R = G, lp-cap) `eplb-periodic`, which places its replicas by
load alone on the hottest experts, had a higher LAR than `sempar-incremental`, whose replica
pass chose slots for the peak alone (docs/results/drift-engines.md). `replica_pass` uses
`local_gain` to choose among retargets of (nearly) equal peak, and, once no retarget lowers
the peak, to retarget for locality without raising it (`ReplicaPass.locality`).

The measure (ours): each token's home is the device holding most of its experts (the tp
mode's home, `schedule.homes.oracle_home`, without its equal shares per batch), its local
activations the experts of the token that device holds; a retarget's gain is the change of
their sum over the tokens given. Counting without the shares keeps it cheap (one vector per
candidate) and is exact where the shares do not bind.

Shapes: T tokens, k experts per token, N experts, G devices, P = G x S slots, C candidates.
"""

from __future__ import annotations

import numpy as np


def token_experts(experts: np.ndarray, N: int) -> np.ndarray:
    """int16[T, N]: 1 where the token selected the expert (one layer's experts int[T, k])."""
    T = experts.shape[0]
    out = np.zeros((T, N), np.int16)
    out[np.repeat(np.arange(T), experts.shape[1]), experts.ravel()] = 1
    return out


def local_gain(row: np.ndarray, G: int, inE: np.ndarray, slot: np.ndarray,
               new: np.ndarray) -> np.ndarray:
    """float64[C]: the change of the tokens' local activations (module docstring) when slot
    slot[c] of row int[P] (device slot // S) is given to expert new[c] instead of row[slot[c]];
    inE int16[T, N] (`token_experts`). A device keeping another copy of the dropped expert
    keeps its hits."""
    row = np.asarray(row, np.int64)
    P = row.size
    S = P // G
    N = inE.shape[1]
    on = np.zeros((G, N), np.int16)
    on[np.arange(P) // S, row] = 1
    hits = inE @ on.T                                                   # [T, G]
    top = hits.max(axis=1)
    arg = hits.argmax(axis=1)
    second = np.sort(hits, axis=1)[:, -2] if G > 1 else np.zeros_like(top)
    d = np.asarray(slot, np.int64) // S
    a = row[slot]
    twice = np.bincount(np.arange(P) // S * N + row, minlength=G * N)[d * N + a] > 1
    col = hits[:, d] - inE[:, a] * (~twice)[None] + inE[:, new]         # [T, C]
    excl = np.where(arg[:, None] == d[None], second[:, None], top[:, None])
    return (np.maximum(excl, col).sum(axis=0) - top.sum()).astype(np.float64)
