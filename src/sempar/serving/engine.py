"""The discrete-event serving loop: requests, iteration-level (continuous) batching, chunked
prefill and a KV-cache budget, for Attention-DP (one instance per rank) or Attention-TP (one
instance over the G devices).

Entities (Vidur's split, our code): a `Workload` of requests (arrival, input and output length,
DP rank), an `Instance` budget (`EngineConfig`), and an execution-time predictor behind one
interface, `step_seconds(prefill, decode, attn_ctx, kv_read, sampled, i) -> seconds`, whose
arguments are float64[instances] arrays for iteration i (see roofline.Roofline.dense_seconds).

One event per iteration, vectorised over running requests (no Python loop over tokens):

1. arrivals up to `now` join their instance's FIFO queue;
2. admission (FIFO): a request starts when its instance has a free running slot and KV room for
   its whole input + output (reserved at admission, as Orca / Sarathi-Serve do, so nothing is
   ever preempted -- our choice);
3. the token budget of each instance goes first to one decode token per running request in
   decode, then to prefill chunks in admission order (Sarathi-Serve's chunked prefill);
4. the iteration lasts `step_seconds`; every instance advances together (Attention-DP: every MoE
   layer waits for the slowest rank, which the predictor accounts for);
5. a request whose prefill completes emits its first token at the iteration's end (TTFT), each
   decode emits one; a request that has all its output tokens leaves and frees its KV.

Time between tokens is measured per request (metrics.py): each request's gaps between
consecutive tokens, from the iteration that gave it its first token to the one that gave it its
last (or the horizon), so a wait between two of its tokens counts in full; the log keeps, per
request, the indices of those two iterations (`first_it`, `last_it`), not one entry per token.
(This loop never leaves a running request out of an iteration -- KV is reserved at admission
and the budget covers one decode token per running request -- so each gap is one iteration.)
When the queue is empty and nothing runs, time jumps to the next arrival.

Decode runs: while no prefill is running, iterations differ only by each request's growing
context, so up to `RUN` of them are timed in one predictor call (float64[K, I] inputs) and
applied at once, stopping at the first request to finish or the iteration during which the next
request arrives -- exactly the iterations the one-by-one loop would run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sempar.errors import InputError


@dataclass
class Workload:
    """arrival float64[R] (s, sorted), in_len / out_len int64[R] (>= 1), rank int32[R] (0 for TP)."""

    arrival: np.ndarray
    in_len: np.ndarray
    out_len: np.ndarray
    rank: np.ndarray

    @property
    def size(self) -> int:
        return int(self.arrival.size)


@dataclass
class EngineConfig:
    """Per instance: `budget` tokens per iteration, `max_running` requests, `kv_capacity` tokens."""

    instances: int
    budget: int
    max_running: int
    kv_capacity: int


@dataclass
class RunLog:
    """first_token / finish float64[R] (nan: not reached before the horizon); per iteration:
    end time, duration, decode tokens and tokens processed (float64[I])."""

    first_token: np.ndarray
    finish: np.ndarray
    it_end: np.ndarray
    it_dt: np.ndarray
    it_decode: np.ndarray
    it_tokens: np.ndarray
    # int64[R]: per request, the iteration that emitted its first token and the one that
    # emitted its last so far (-1: none); metrics.request_gaps reads its gaps from them
    first_it: np.ndarray | None = None
    last_it: np.ndarray | None = None


# step_seconds(prefill, decode, attn_ctx, kv_read, sampled, i) -> float64[K]: K iterations,
# float64[K, I] per instance, i int64[K] the iterations' indices.
Predictor = Callable[..., np.ndarray]
RUN = 64


def run(w: Workload, cfg: EngineConfig, step_seconds: Predictor, horizon: float) -> RunLog:
    """Serve `w` until every request finishes or time passes `horizon` seconds."""
    R, G, M = w.size, cfg.instances, cfg.max_running
    need = (w.in_len + w.out_len).astype(np.int64)
    if R and need.max() > cfg.kv_capacity:
        raise InputError(f"a request of {int(need.max())} tokens exceeds the KV capacity of "
                         f"{cfg.kv_capacity} tokens per instance")
    if cfg.budget < M:
        raise InputError(f"token budget {cfg.budget} is below max running requests {M}")
    S = G * M
    req = np.full(S, -1, np.int64)                 # request in each slot, -1 = free
    srank = np.repeat(np.arange(G), M)
    pleft = np.zeros(S, np.int64)                  # prefill tokens left
    ctx = np.zeros(S, np.int64)                    # tokens in the KV cache
    gen = np.zeros(S, np.int64)                    # output tokens emitted
    olen = np.zeros(S, np.int64)
    seq = np.zeros(S, np.int64)                    # admission order
    free = [list(range((g + 1) * M - 1, g * M - 1, -1)) for g in range(G)]
    waiting = [deque() for _ in range(G)]
    kv_used = [0] * G
    first = np.full(R, np.nan)
    finish = np.full(R, np.nan)
    first_it = np.full(R, -1, np.int64)
    last_it = np.full(R, -1, np.int64)
    log_end, log_dt, log_n, log_dec, log_tok = [], [], [], [], []
    zeros, ar = np.zeros((RUN, G)), np.arange(RUN)
    arrival, rank = w.arrival, w.rank.astype(np.int64)
    need_l = need.tolist()
    now, nxt, admitted, running, i, last_dt = 0.0, 0, 0, 0, 0, 0.0
    while now <= horizon:
        while nxt < R and arrival[nxt] <= now:
            waiting[rank[nxt]].append(nxt)
            nxt += 1
        for g in range(G):
            q = waiting[g]
            while q and free[g] and kv_used[g] + need_l[q[0]] <= cfg.kv_capacity:
                r = q.popleft()
                s = free[g].pop()
                req[s], pleft[s], ctx[s], gen[s], olen[s], seq[s] = r, w.in_len[r], 0, 0, w.out_len[r], admitted
                kv_used[g] += need_l[r]
                admitted += 1
                running += 1
        if running == 0:
            if nxt >= R:
                break
            now = max(now, float(arrival[nxt]))
            continue
        act = req >= 0
        dec = act & (pleft == 0)
        pre = np.flatnonzero(act & (pleft > 0))
        ndec = np.bincount(srank[dec], minlength=G).astype(np.float64)
        dctx = np.bincount(srank[dec], ctx[dec] + 1, minlength=G)
        if pre.size == 0:                           # a run of decode-only iterations
            left = (olen - gen)[dec]
            K = int(min(RUN, left.min()))
            if nxt < R and last_dt > 0:             # time only the iterations likely needed
                K = max(1, min(K, int((arrival[nxt] - now) / last_dt) + 2))
            j = np.arange(K, dtype=np.float64)[:, None]
            kv = dctx[None, :] + j * ndec[None, :]
            d2 = np.broadcast_to(ndec, (K, G))
            dts = step_seconds(zeros[:K], d2, kv, kv, d2, i + ar[:K])
            ends = now + np.cumsum(dts)
            if nxt < R:
                K = min(K, int(np.searchsorted(ends, arrival[nxt], side="left")) + 1)
            now = float(ends[K - 1])
            last_dt = float(dts[K - 1])
            nd = float(ndec.sum())
            log_end.append(ends[:K]), log_dt.append(dts[:K])
            log_n.append(K), log_dec.append(nd), log_tok.append(nd)
            i += K
            gen[dec] += K
            ctx[dec] += K
            last_it[req[dec]] = i - 1
        else:
            order = pre[np.lexsort((seq[pre], srank[pre]))]
            pl, rk = pleft[order], srank[order]
            before = np.cumsum(pl) - pl
            if rk[0] == rk[-1]:                    # one instance prefilling (the usual case)
                within = before
            else:
                starts = np.flatnonzero(np.concatenate(([True], rk[1:] != rk[:-1])))
                lens = np.diff(np.concatenate((starts, [rk.size])))
                within = before - np.repeat(before[starts], lens)
            alloc = np.minimum(np.maximum((cfg.budget - ndec[rk]).astype(np.int64) - within, 0), pl)
            c0 = ctx[order]
            npre = np.bincount(rk, alloc, minlength=G)
            actx = np.bincount(rk, alloc * c0 + alloc * (alloc + 1) / 2, minlength=G)
            kvp = np.bincount(rk, (c0 + alloc) * (alloc > 0), minlength=G)
            done_pre = (alloc > 0) & (alloc == pl)
            samp = np.bincount(rk, done_pre, minlength=G) + ndec
            dt = float(step_seconds(npre[None], ndec[None], (actx + dctx)[None],
                                    (kvp + dctx)[None], samp[None], np.array([i]))[0])
            now += dt
            i += 1
            nd = float(ndec.sum())
            log_end.append([now]), log_dt.append([dt])
            log_n.append(1), log_dec.append(nd), log_tok.append(nd + float(alloc.sum()))
            gen[dec] += 1                          # decode slots are disjoint from prefill ones
            ctx[dec] += 1
            last_it[req[dec]] = i - 1
            pleft[order] -= alloc
            ctx[order] += alloc
            fin_pre = order[done_pre]
            gen[fin_pre] = 1
            first[req[fin_pre]] = now
            first_it[req[fin_pre]] = i - 1
            last_it[req[fin_pre]] = i - 1
        out = np.flatnonzero(act & (pleft == 0) & (gen >= olen))
        if out.size:
            rs = req[out]
            finish[rs] = now
            for s, r in zip(out.tolist(), rs.tolist()):
                g = s // M
                free[g].append(s)
                kv_used[g] -= need_l[r]
            req[out] = -1
            running -= out.size
    cat = lambda xs: np.concatenate(xs).astype(np.float64) if xs else np.zeros(0)  # noqa: E731
    rep = lambda xs: np.repeat(np.asarray(xs, np.float64), log_n)  # noqa: E731
    return RunLog(first, finish, cat(log_end), cat(log_dt), rep(log_dec), rep(log_tok),
                  first_it, last_it)
