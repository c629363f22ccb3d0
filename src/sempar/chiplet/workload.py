"""Tokens-per-iteration batches from a RoutingTrace, mapped onto a model shape (FSE-DP §VI-A).

FSE-DP measures "effective batch" as *tokens per iteration*: the input tokens of a few concurrent
requests, prefill and decode mixed (chunked prefill), processed in one forward iteration. We assemble
such batches from any trace (ours, the paper gives no procedure):

- a request's rows are its tokens in position order; its first `prefill_fraction` (half, at least
  one token) is the prompt, the rest are decode steps;
- each iteration first takes one decode token from every request past its prompt (oldest first),
  then fills the remaining budget with prompt chunks of the oldest requests still in prefill,
  admitting new requests in trace order; exactly `tokens_per_iter` tokens per iteration;
- when the trace runs out, assembly wraps around to its first request (`wrapped` is set).

**Expert mapping** when the trace's expert count N' or top-k k' differs from the model's N, k
(`map_experts`, ours): slots beyond k' reuse slot j - k' shifted by one expert per round; slots
beyond k are dropped (the trace lists experts by router rank); an expert id e' maps to
floor(e' N / N') plus, when N > N', token_id mod ceil(N / N') (a trace expert splits into N / N'
model experts by token, keeping the per-token determinism that makes routing skewed); duplicates in
a row are bumped to the next free id. Model layer l reads trace layer l mod L'. Shared experts get
ids N .. N + shared - 1 and every token.
"""

from __future__ import annotations

import math
from pathlib import Path
from dataclasses import KW_ONLY, dataclass, field

import numpy as np

from sempar.chiplet.models import MoEModel
from sempar.errors import InputError
from sempar.trace.schema import RoutingTrace

TOKEN_COUNTS = (16, 64, 256, 1024)


def map_experts(experts: np.ndarray, token_id: np.ndarray, n_trace: int, model: MoEModel) -> np.ndarray:
    """Map trace experts int[n, k'] onto the model: int16[n, top_k + shared] (see module doc)."""
    n, kt = experts.shape
    N, k = model.experts, model.top_k
    cols = []
    for j in range(k):
        base = experts[:, j % kt].astype(np.int64)
        cols.append((base + j // kt) % n_trace)
    e = np.stack(cols, axis=1) if cols else np.zeros((n, 0), np.int64)
    if N != n_trace:
        e = (e * N) // n_trace
        if N > n_trace:
            split = math.ceil(N / n_trace)
            e = np.minimum(e + (token_id.astype(np.int64) % split)[:, None], N - 1)
    for j in range(1, k):            # bump duplicates to the next free id
        for _ in range(k + 1):
            dup = (e[:, j:j + 1] == e[:, :j]).any(axis=1)
            if not dup.any():
                break
            e[dup, j] = (e[dup, j] + 1) % N
    if model.shared:
        e = np.concatenate([e, np.broadcast_to(np.arange(N, N + model.shared), (n, model.shared))], axis=1)
    return e.astype(np.int16)


@dataclass
class Iteration:
    """One forward iteration: rows int64[T] into the trace, request int64[T], position int64[T]."""

    rows: np.ndarray
    request: np.ndarray
    position: np.ndarray


@dataclass
class Workload:
    """Iterations assembled from a trace plus the model-mapped routing of every used row.

    `experts[r, l]` int16[U, L', top_k + shared] for the U used rows (index via `row_index`).
    """

    model: MoEModel
    tokens_per_iter: int
    iterations: list[Iteration]
    experts: np.ndarray
    _: KW_ONLY
    row_index: dict = field(repr=False, default_factory=dict)
    trace_layers: int = 1
    wrapped: bool = False
    source: str = ""

    def layer_experts(self, urows: np.ndarray, layer: int) -> np.ndarray:
        """int16[n, K] experts of used-row indices `urows` at model layer `layer`."""
        return self.experts[urows, layer % self.trace_layers]


def assemble(trace: RoutingTrace, model: MoEModel, tokens_per_iter: int, iterations: int = 100,
             prefill_fraction: float = 0.5, source: str = "") -> Workload:
    """Build `iterations` batches of exactly `tokens_per_iter` tokens (module doc)."""
    if tokens_per_iter < 1:
        raise InputError(f"--tokens-per-iter: {tokens_per_iter} must be at least 1")
    if iterations < 1:
        raise InputError(f"--iterations: {iterations} must be at least 1")
    if trace.num_tokens < 1:
        raise InputError("trace: it has no tokens")
    order = np.lexsort((trace.position, trace.request_id))
    req_sorted = trace.request_id[order]
    starts = np.flatnonzero(np.r_[True, req_sorted[1:] != req_sorted[:-1]])
    ends = np.r_[starts[1:], req_sorted.size]
    R = starts.size
    nxt = 0                     # next request to admit
    wrapped = False
    active: list[list[int]] = []   # [start, end, cursor, prompt_end, request_key]
    key = 0
    out: list[Iteration] = []
    for _ in range(iterations):
        rows: list[np.ndarray] = []
        reqs: list[np.ndarray] = []
        budget = tokens_per_iter
        for a in active:                       # one decode token per request past its prompt
            if budget and a[2] >= a[3] and a[2] < a[1]:
                rows.append(order[a[2]:a[2] + 1]); reqs.append(np.array([a[4]])); a[2] += 1; budget -= 1
        i = 0
        while budget:
            if i == len(active):
                s, e = int(starts[nxt]), int(ends[nxt])
                active.append([s, e, s, s + max(1, math.ceil((e - s) * prefill_fraction)), key])
                key += 1
                nxt += 1
                if nxt == R:
                    nxt, wrapped = 0, True
            a = active[i]
            if a[2] < a[3]:                    # prompt chunk
                take = min(budget, a[3] - a[2])
                rows.append(order[a[2]:a[2] + take]); reqs.append(np.full(take, a[4])); a[2] += take
                budget -= take
            i += 1
        active = [a for a in active if a[2] < a[1]]
        r = np.concatenate(rows)
        out.append(Iteration(r, np.concatenate(reqs), trace.position[r].astype(np.int64)))
    used = np.unique(np.concatenate([it.rows for it in out]))
    mapped = np.stack([map_experts(trace.experts[used, l], trace.token_id[used], trace.meta.num_experts,
                                   model) for l in range(trace.meta.num_layers)], axis=1)
    row_index = {int(r): i for i, r in enumerate(used)}
    for it in out:
        it.rows = np.fromiter((row_index[int(x)] for x in it.rows), np.int64, it.rows.size)
    return Workload(model, tokens_per_iter, out, mapped, row_index=row_index,
                    trace_layers=trace.meta.num_layers, wrapped=wrapped, source=source)


@dataclass
class Instances:
    """The (iteration, layer) MoE-layer instances the engines simulate, in CSR form.

    - `experts`: int16[sum n_b, K] model experts of every token of every instance;
    - `offsets`: int64[B + 1]; instance b owns rows offsets[b]:offsets[b+1];
    - `request`: int64[sum n_b]; `layer`, `iteration`: int64[B];
    - `ctx`: int64[sum n_b] context length (position + 1) for the attention model.
    Tokens of an instance are sharded evenly over the dies by their index (§III: "tokens are evenly
    sharded across the chiplets"): token i of n goes to die i * D // n.
    """

    experts: np.ndarray
    offsets: np.ndarray
    request: np.ndarray
    layer: np.ndarray
    iteration: np.ndarray
    ctx: np.ndarray
    num_experts: int

    @property
    def B(self) -> int:
        return self.offsets.size - 1

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def home(self, dies: int) -> np.ndarray:
        """int64[sum n_b] home die of each token (even contiguous shard within its instance)."""
        n = np.repeat(self.sizes(), self.sizes())
        idx = np.arange(self.offsets[-1]) - np.repeat(self.offsets[:-1], self.sizes())
        return idx * dies // np.maximum(n, 1)

    def counts(self, dies: int, home: np.ndarray | None = None) -> np.ndarray:
        """int32[B, E, D]: tokens of expert e homed on die d in instance b."""
        home = self.home(dies) if home is None else home
        E = self.num_experts
        inst = np.repeat(np.arange(self.B), self.sizes())
        out = np.zeros(self.B * E * dies, np.int64)
        step = 1 << 20
        for lo in range(0, inst.size, step):
            sl = slice(lo, lo + step)
            idx = ((inst[sl, None] * E + self.experts[sl].astype(np.int64)) * dies + home[sl, None])
            out += np.bincount(idx.ravel(), minlength=out.size)
        return out.reshape(self.B, E, dies).astype(np.int32)


def plain_instances(wl: Workload) -> Instances:
    """Every iteration's own tokens at every model layer (no token buffering)."""
    L = wl.model.layers
    parts, reqs, ctxs, offs, lay, its = [], [], [], [0], [], []
    for i, it in enumerate(wl.iterations):
        for layer in range(L):
            parts.append(wl.layer_experts(it.rows, layer))
            reqs.append(it.request)
            ctxs.append(it.position + 1)
            offs.append(offs[-1] + it.rows.size)
            lay.append(layer)
            its.append(i)
    return Instances(np.concatenate(parts), np.array(offs), np.concatenate(reqs), np.array(lay),
                     np.array(its), np.concatenate(ctxs), wl.model.total_experts)


def load_workload(model: str, trace: Path | str | None, tokens_per_iter: int, iterations: int, seed: int):
    """The model and its workload: from `trace`, or a synthetic trace of the model's own shape."""
    from sempar.chiplet.models import MODELS
    from sempar.errors import InputError

    m = MODELS.get(model)
    if trace is not None:
        from sempar.trace import read_trace
        if not Path(trace).exists():
            raise InputError(f"--trace: {trace} does not exist")
        tr = read_trace(trace)
        source = str(trace)
    else:
        from sempar.trace.presets import PRESETS
        from sempar.trace.schema import TraceMeta
        from sempar.trace.synth import synthesize
        shape = PRESETS.get(m.name) if m.name in PRESETS else TraceMeta(m.name, m.layers, m.experts, m.top_k, 32000)
        need = tokens_per_iter * iterations
        tokens = int(need * 1.3) + 1024
        tr = synthesize(shape, tokens, requests=max(2, tokens // 160), seed=seed)
        source = f"synthetic:{m.name}"
    return m, assemble(tr, m, tokens_per_iter, iterations, source=source)
