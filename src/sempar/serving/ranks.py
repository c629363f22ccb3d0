"""Attention-DP ranks of the simulated requests: the system's request policy run on the lengths
the serving loop serves, not on the trace's.

Simulated request i replays request j = i mod R of the simulated split (workload.py). A
length-aware policy (`balanced` balances the tokens each rank holds) must see what that request
costs in the simulation: `served_lengths` tokens, i.e. input + output as `--lengths` draws them
(`fixed`: input_len + output_len for every request; `trace`: the trace request's token count +
output_len; `exp`: the means input_len + output_len, since its lengths are drawn per simulated
request at each rate; the output length counted is the fixed / mean one, which a router in front
of the ranks can know, not the drawn one).

The policy reads the request's tokens: replayed request j's token ids, repeated from its start
up to its served length (ours: the output's tokens are unknown at arrival; repeating the prompt
keeps each token's share of the request's score, so a policy that only ranks the scores --
`alg2`, `balanced` -- prefers the same ranks as on the trace). The scheduler is the one the
engine would run (`schedule.online.OnlineScheduler` fitted on the fit split, unseen tokens
mapped by the model's input embedding), its token table feeding `schedule.requests`' policy.
"""

from __future__ import annotations

import numpy as np

from sempar.errors import InputError
from sempar.placement.capacity import BATCH
from sempar.placement.placement import Placement
from sempar.serving.workload import LENGTHS
from sempar.trace.schema import RoutingTrace


def served_lengths(request_tokens: np.ndarray, lengths: str, input_len: int,
                   output_len: int) -> np.ndarray:
    """int64[R]: tokens each replayed request puts through the model in the simulation
    (request_tokens int64[R]: its token count in the trace)."""
    if lengths == "trace":
        return np.asarray(request_tokens, np.int64) + int(output_len)
    if lengths in LENGTHS:
        return np.full(request_tokens.size, int(input_len) + int(output_len), np.int64)
    raise InputError(f"--lengths: {lengths!r} is not one of {', '.join(LENGTHS)}")


def tiled_requests(token_id: np.ndarray, offsets: np.ndarray, n: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(token_ids int64[sum n], offsets int64[R + 1]): request r's tokens
    token_id[offsets[r]:offsets[r + 1]] repeated from the start to n[r] tokens."""
    off = np.asarray(offsets, np.int64)
    count = np.diff(off)
    n = np.asarray(n, np.int64)
    if (count < 1).any() or (n < 1).any():
        raise InputError("every request needs at least one token")
    req = np.repeat(np.arange(n.size), n)
    start = np.cumsum(n) - n
    pos = np.arange(req.size, dtype=np.int64) - start[req]
    tok = np.asarray(token_id, np.int64)[off[req] + pos % count[req]]
    return tok, np.concatenate([[0], np.cumsum(n)]).astype(np.int64)


def policy_ranks(placement: Placement, fit: RoutingTrace, eval_: RoutingTrace, policy: str,
                 served: np.ndarray, batch: int = BATCH) -> np.ndarray:
    """int32[R]: the DP rank `policy` gives each request of `eval_` (first-appearance order)
    when request r holds served[r] tokens (int64[R])."""
    from sempar.schedule.online import OnlineScheduler, model_embedding
    from sempar.schedule.requests import make_policy, request_arrays

    tok, off, _ = request_arrays(eval_.request_id, eval_.token_id)
    if served.size != off.size - 1:
        raise InputError(f"served lengths: {served.size} given for {off.size - 1} requests")
    sched = OnlineScheduler(oov=model_embedding(eval_.meta.model), batch=batch).fit(fit, placement)
    td = sched.token_device_
    if td.oov_ is not None:
        tok = td.oov_.map(tok)
    tiled, toff = tiled_requests(tok, off, served)
    return make_policy(policy, placement.num_devices, td.table_).assign(tiled, toff)
