"""The device state of a (token, layer) under a placement (Sem-MoE B.1, s-MoE B.1).

Both papers model "the activation device sequence rather than the activation expert sequence":
D^(l) is "the device index where the chosen expert locates at the l-th layer". A token selects k
experts, so we define its **device state** at layer l as the device hosting the most of its k
real selected experts under the placement; an expert with replicas counts for every device that
hosts it; ties go to the lowest device id (`affinity.affinity_stats.device_states`). This state
is also the ground truth the token and n-gram tables are scored against: sending the
token there makes the most of its activations local.

Placements are duck-typed (anything with `hosts() -> bool[L, G, N]`), so this package never
imports `sempar.placement`, which imports `sempar.predict.token_table`.
"""

from __future__ import annotations

import numpy as np

from sempar.errors import InputError
from sempar.trace.schema import RoutingTrace

def check_placement(trace: RoutingTrace, hosts: np.ndarray) -> None:
    """Raise `InputError` when a placement's hosts bool[L, G, N] does not fit the trace's model."""
    L, N = trace.meta.num_layers, trace.meta.num_experts
    if hosts.shape[0] != L or hosts.shape[2] != N:
        raise InputError(f"placement: {hosts.shape[0]} layers x {hosts.shape[2]} experts, the "
                         f"trace has {L} x {N}")


def fit_inputs(trace: RoutingTrace, placement) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hosts bool[L, G, N], tokens int64[U] distinct token ids, tok int64[T] each row's index
    into tokens) of a placement checked against the trace: what every fitted table starts from."""
    hosts = placement.hosts()
    check_placement(trace, hosts)
    tokens, tok = np.unique(np.asarray(trace.token_id, np.int64), return_inverse=True)
    return hosts, tokens, tok


def local_share(experts: np.ndarray, hosts: np.ndarray, device: np.ndarray) -> np.ndarray:
    """float64[T, L]: share of each token's k activations hosted on `device` (0 where device < 0).

    experts: int[T, L, k]; hosts: bool[L, G, N]; device: int[T, L] a predicted home per layer.
    """
    T, L, k = experts.shape
    out = np.zeros((T, L))
    for l in range(L):
        d = device[:, l].astype(np.int64)
        ok = d >= 0
        hit = hosts[l][np.where(ok, d, 0)[:, None], experts[:, l].astype(np.int64)]
        out[:, l] = np.where(ok, hit.sum(axis=1) / k, 0.0)
    return out
