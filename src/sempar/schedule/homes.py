"""Home devices: every rule that says where a token's hidden state sits when layer l's router runs
(docs/design.md, "Home device"). Each returns int32[T, L] for a trace's T tokens and L layers.

Vanilla (no scheduler):
- `home_tp_contiguous`: attention TP, per batch of `batch` tokens equal contiguous chunks (token
  i of n to device i * G // n);
- `home_dp_round_robin`: attention DP, the r-th request in arrival order on rank r mod G.

Scheduled:
- `home_from_ranks`: attention DP, every token of a request on its request's rank, every layer
  (the ranks from a `schedule.requests` policy);
- `home_dp_table`: Sem-MoE Alg. 2 (`requests.Alg2`) with a placement's own token table;
- `home_tp_table`: Sem-MoE Alg. 3's align step with a token table's device and confidence per
  (token, layer): per batch each device keeps its most confident askers up to its equal share,
  the rest (unknown tokens, overflow) fill the room left in token order (ours);
- `rebatched_home`: Alg. 3 / s-MoE Alg. 2 re-batching (`rebatch.REBATCHERS`) of predicted
  devices, per batch and layer (the online schedulers', the runtime's);
- `method_home`: a placement's own rule (its token table when it has one, else vanilla).

Knowing the real routing:
- `oracle_home`: tp mode, each (token, layer) on the device hosting most of its experts, under
  equal shares per batch (`placement.capacity.capacity_home`, `rule` of
  `capacity.ASSIGN_RULES`: by default "optimal", the assignment with the most local activations
  within the shares, or "proposal" rounds; `slack`: each device at most
  ceil((1 + slack) x batch / G)), or free (batch=None). With the recorded experts this is also
  the exact pre-router's home
  (`prerouter`, pipeline `smoe-exact`);
- `oracle_home_dp`: dp mode, whole requests, each round of G requests matched to the G ranks
  maximising local activations (Hungarian), or each on its best rank (balanced=False).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from sempar.errors import InputError
from sempar.placement.capacity import (BATCH, DEFAULT_ASSIGN, capacity_home, equal_shares,
                                       fill_in_order, proposal_rounds)
from sempar.placement.placement import Placement
from sempar.predict.token_table import TokenTable
from sempar.schedule.rebatch import REBATCHERS
from sempar.schedule.requests import Alg2, request_arrays
from sempar.trace.schema import RoutingTrace, require_token_ids


def _layers(per_token: np.ndarray, num_layers: int) -> np.ndarray:
    return np.repeat(np.asarray(per_token, np.int32)[:, None], num_layers, axis=1)


def home_from_ranks(request_id: np.ndarray, ranks: np.ndarray, num_layers: int) -> np.ndarray:
    """int32[T, L]: every token of a request sits on its rank at every layer (Attention-DP).

    request_id int[T]; ranks int[R], one per request in arrival order (order of first appearance
    in request_id).
    """
    _, first, inv = np.unique(request_id, return_index=True, return_inverse=True)
    if np.asarray(ranks).size != first.size:
        raise InputError(f"ranks: {np.asarray(ranks).size} given for {first.size} requests")
    arrival = np.empty(first.size, np.int64)
    arrival[np.argsort(first, kind="stable")] = np.arange(first.size)
    return _layers(np.asarray(ranks, np.int32)[arrival][inv.reshape(-1)], num_layers)


def _policy_home(policy, request_id: np.ndarray, token_id: np.ndarray, num_layers: int
                 ) -> np.ndarray:
    tokens, offsets, _ = request_arrays(request_id, token_id)
    return home_from_ranks(request_id, policy.assign(tokens, offsets), num_layers)


def home_dp_round_robin(request_id: np.ndarray, num_devices: int, num_layers: int) -> np.ndarray:
    """int32[T, L]: request r-th in arrival order sits on DP rank r mod G, for every layer."""
    ranks = np.arange(np.unique(request_id).size) % num_devices
    return home_from_ranks(request_id, ranks, num_layers)


def home_dp_table(request_id: np.ndarray, token_id: np.ndarray, table: TokenTable,
                  num_devices: int, num_layers: int) -> np.ndarray:
    """int32[T, L]: requests (arrival order) to DP ranks by Sem-MoE Alg. 2 with a token table."""
    return _policy_home(Alg2(num_devices, TokenTable.from_json(table)), request_id, token_id,
                        num_layers)


def home_tp_contiguous(num_tokens: int, num_devices: int, num_layers: int,
                       batch: int = BATCH) -> np.ndarray:
    """int32[T, L]: within each batch, token i of n goes to device i * G // n (equal chunks)."""
    pos = np.arange(num_tokens)
    start = pos - pos % batch
    n = np.minimum(batch, num_tokens - start)
    return _layers((pos - start) * num_devices // n, num_layers)


def home_tp_table(token_id: np.ndarray, table: TokenTable, num_devices: int,
                  batch: int = BATCH) -> np.ndarray:
    """int32[T, L]: tokens placed by a token table T[l, token] (confidence Tp), equal shares per
    device per batch (Sem-MoE Alg. 3's align step): one proposal round of the most confident
    askers per device; unknown tokens and the overflow fill the room left in token order (ours)."""
    table = TokenTable.from_json(table)
    known, dev, conf = table.token_id, table.device, table.confidence   # [U], [L, U], [L, U]
    L = dev.shape[0]
    pos = np.minimum(np.searchsorted(known, token_id), known.size - 1)
    seen = known[pos] == token_id
    T, G = token_id.size, num_devices
    home = np.empty((T, L), np.int32)
    for l in range(L):
        want = np.where(seen, dev[l, pos], -1)
        score = np.where(seen, conf[l, pos], -1.0)
        for lo in range(0, T, batch):
            w = want[lo:lo + batch]
            got, room = proposal_rounds(w[:, None], score[lo:lo + batch],
                                        equal_shares(w.size, G))
            home[lo:lo + batch, l] = fill_in_order(got, room)
    return home


def rebatched_home(target: torch.Tensor, num_devices: int, priority: torch.Tensor | None = None,
                   batch: int = BATCH, strategy: str = "align",
                   scores: torch.Tensor | None = None) -> np.ndarray:
    """int32[T, L]: the chunk each token lands in when every batch of `batch` tokens is re-batched
    at every layer by `strategy` (`rebatch.REBATCHERS`); target int[T, L] the predicted device
    (-1 none), priority float[T, L] or None (which tokens a full device keeps), scores
    float[T, L, G] or None (where a full device's overflow goes: `rebatch.plan_align`)."""
    plan = REBATCHERS.get(strategy)
    target = target.long()
    home = torch.empty(target.shape, dtype=torch.int64)
    for lo in range(0, target.shape[0], batch):
        sl = slice(lo, lo + batch)
        for l in range(target.shape[1]):
            home[sl, l] = plan(target[sl, l], num_devices,
                               None if priority is None else priority[sl, l],
                               scores=None if scores is None else scores[sl, l]).home_device()
    return home.numpy().astype(np.int32)


def local_hits(placement: Placement, experts: np.ndarray, layer: int) -> np.ndarray:
    """int[T, G]: how many of each token's experts int[T, L, k] at `layer` device g hosts."""
    return placement.hosts()[layer][:, experts[:, layer]].sum(axis=2).T


def oracle_home(placement: Placement, experts: np.ndarray, batch: int | None = BATCH,
                slack: float = 0.0, rule: str = DEFAULT_ASSIGN) -> np.ndarray:
    """int32[T, L]: each (token, layer) on the device hosting most of its experts (ties: lower
    id). With `batch`, every device takes an equal share of each batch (tp mode's align step) by
    `rule` (`placement.capacity.capacity_home`: the "optimal" assignment, the most local
    activations within the shares, the default; or greedy "proposal" rounds), or with `slack`
    in (0, 1) at most ceil((1 + slack) x batch / G) of it (`capacity.slack_shares`);
    batch=None: unconstrained."""
    T, L, _ = experts.shape
    home = np.empty((T, L), np.int32)
    for l in range(L):
        hits = local_hits(placement, experts, l)
        home[:, l] = (hits.argmax(axis=1) if batch is None
                      else capacity_home(hits, batch, slack, rule))
    return home


def oracle_home_dp(placement: Placement, trace: RoutingTrace, balanced: bool = True) -> np.ndarray:
    """int32[T, L]: whole requests on DP ranks knowing their routing; each round of G requests
    (arrival order) is matched to the G ranks maximising local activations (Hungarian). With
    balanced=False every request goes to its best rank (the request-level ceiling without
    balance)."""
    G, L = placement.num_devices, trace.meta.num_layers
    reqs, first, ridx = np.unique(trace.request_id, return_index=True, return_inverse=True)
    hits = np.zeros((reqs.size, G))
    for l in range(L):
        np.add.at(hits, ridx, local_hits(placement, trace.experts, l))
    if not balanced:
        return _layers(hits.argmax(axis=1)[ridx], L)
    order = np.argsort(first, kind="stable")
    rank = np.empty(reqs.size, np.int32)
    for lo in range(0, order.size, G):
        group = order[lo:lo + G]
        rows, cols = linear_sum_assignment(-hits[group])
        rank[group[rows]] = cols
    return _layers(rank[ridx], L)


def method_home(placement: Placement, eval_: RoutingTrace, mode: str) -> np.ndarray:
    """int32[T, L]: where the method itself puts each eval token: its own token table when it has
    one (dp: Alg. 2; tp: `home_tp_table`), else round-robin requests (dp) or contiguous chunks
    of every batch (tp)."""
    ep, L = placement.num_devices, eval_.meta.num_layers
    table = placement.token_table
    if table is not None:
        require_token_ids(eval_.meta, f"{placement.method}'s token table")
    if mode == "dp":
        return (home_dp_table(eval_.request_id, eval_.token_id, table, ep, L) if table is not None
                else home_dp_round_robin(eval_.request_id, ep, L))
    return (home_tp_table(eval_.token_id, table, ep) if table is not None
            else home_tp_contiguous(eval_.num_tokens, ep, L))
