"""Per-iteration communication and routed-expert time, tabulated once per batch size bucket.

An iteration's MoE cost depends on which tokens it holds: their routing, their homes (the
system's request policy or re-batching), the placement, the pipeline and the topology. Running
`sempar.comm.simulate` on every iteration would dominate a 50k-request run, so per system we draw,
for every bucket of n = 1, 2, 4, ... tokens, S batches of n tokens at random from the simulated
split of the trace (each with its routing and the home the system gives it), and keep per batch:

- `comm`: `comm_seconds` of one pass through all MoE layers (CAMoE eq. 9 for the all-to-alls plus
  the pipeline's rings, comm/simulate.py);
- `a2a`: its all-to-all part (metadata, dispatch, combine; `comm` minus the attention-side
  collectives), so a forecast can be split as `sempar bench` times a layer;
- `expert`: the routed experts' roofline time (roofline.Roofline.expert_seconds) from the copies
  each device serves and the distinct experts it activates, per layer, slowest device.

`lookup(n, i)` interpolates linearly in log2(n) between the two neighbouring buckets and cycles
through their S samples with the iteration counter i, so successive iterations see the spread of
real batches, not only their mean. Sampling is uniform over tokens (an iteration mixes the decode
tokens of many requests with a few prefill chunks; ours: tokens drawn independently, each with
its own request's home).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sempar.comm.pipelines import Pipeline
from sempar.comm.simulate import SimOptions, replica_table, simulate
from sempar.comm.topology import Topology
from sempar.placement.placement import Placement
from sempar.serving.roofline import Roofline

SAMPLE_TOKENS = 32768       # tokens drawn per bucket (at least MIN_S, at most MAX_S batches)
MIN_S, MAX_S = 4, 16


@dataclass
class StepTable:
    """sizes int64[B] (1, 2, 4, ...); comm, expert, a2a float64[B, MAX_S]; count int64[B]
    samples."""

    sizes: np.ndarray
    comm: np.ndarray
    expert: np.ndarray
    count: np.ndarray
    lar: float | None = None
    a2a: np.ndarray | None = None

    def _at(self, n: np.ndarray | float, i: np.ndarray):
        """Where iterations of n tokens (int[K], or one number for all) with sample indices i
        int[K] fall in the table: rows lo / hi and samples s0 / s1 int, the weight f of hi, and
        `zero` (n <= 0: no time) bool or bool[K]."""
        i = np.asarray(i, np.int64)
        top = len(self.sizes) - 1.0
        if np.ndim(n) == 0:
            x = min(np.log2(n), top) if n > 0 else 0.0
            lo = int(x)
            hi = min(lo + 1, len(self.sizes) - 1)
            zero = bool(n <= 0)
        else:
            n = np.asarray(n, np.float64)
            x = np.minimum(np.log2(np.maximum(n, 1.0)), top)
            lo = x.astype(np.int64)
            hi = np.minimum(lo + 1, len(self.sizes) - 1)
            zero = n <= 0
        return lo, i % self.count[lo], hi, i % self.count[hi], x - lo, zero

    @staticmethod
    def _blend(mat: np.ndarray, at) -> np.ndarray:
        lo, s0, hi, s1, f, zero = at
        if zero is True:                            # one n for all (the event loop's hot path)
            return np.zeros(s0.shape)
        v = mat[lo, s0] * (1 - f) + mat[hi, s1] * f
        return v if zero is False else np.where(zero, 0.0, v)

    def lookup(self, n: np.ndarray | float, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(comm seconds, expert seconds) float64[K] of iterations of n tokens (int[K], or one
        number for all), sample indices i int[K]; linear in log2(n) between table rows."""
        at = self._at(n, i)
        return self._blend(self.comm, at), self._blend(self.expert, at)

    def lookup_a2a(self, n: float, i: np.ndarray) -> np.ndarray:
        """float64[K]: the all-to-all part of `lookup`'s comm for iterations of n tokens."""
        return self._blend(self.a2a, self._at(n, i))

    def mean(self, n: int) -> tuple[float, float]:
        """Mean over samples (for capacity estimates)."""
        c, e = self.lookup(np.full(MAX_S, n), np.arange(MAX_S))
        return float(c.mean()), float(e.mean())


def dispatched(experts: np.ndarray, home: np.ndarray | None, placement: Placement, n: int,
               ep: bool) -> np.ndarray | None:
    """int32[S*n, L, k]: the device serving each activation of S batches of n tokens under the
    placement's dispatch rule (`info["dispatch"]`, placement/dispatch.py, each batch one engine
    step; issue 45), or None where the nearest copy serves (no replicas, no rule, `nearest`, no
    expert parallelism): then `replica_table`'s nearest copy is the rule of both the bytes
    (`comm.simulate`) and the expert loads."""
    rule = placement.info.get("dispatch")
    if not ep or home is None or rule in (None, "nearest") or placement.redundant == 0:
        return None
    from sempar.placement.dispatch import dispatch_all

    return dispatch_all(placement, experts, home, rule, np.arange(experts.shape[0]) // n, 0)


def expert_loads(experts: np.ndarray, home: np.ndarray | None, placement: Placement,
                 topo: Topology, nbytes: float, S: int, n: int, ep: bool,
                 served: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(copies, active) float64[S, L, G] for S batches of n tokens: experts int[S*n, L, k], home
    int[S*n, L] -> (token, expert) copies each device serves and distinct experts it activates.
    Without expert parallelism every device holds 1/G of every expert (expert TP). served
    int[S*n, L, k]: the device serving each activation (None: `dispatched`'s, else the nearest
    copy by the topology's cost, `replica_table`), as `comm.simulate` counts the bytes."""
    T, L, k = experts.shape
    G, N = placement.num_devices, placement.num_experts
    sample = np.repeat(np.arange(S), n * k)
    copies = np.zeros((S, L, G))
    active = np.zeros((S, L, G))
    if not ep:
        for l in range(L):
            e = experts[:, l, :].reshape(-1)
            act = np.bincount(sample * N + e, minlength=S * N).reshape(S, N) > 0
            copies[:, l, :] = (n * k / G)
            active[:, l, :] = act.sum(axis=1, keepdims=True) / G
        return copies, active
    if served is None:
        served = dispatched(experts, home, placement, n, ep)
    if served is None:
        table, by_home = replica_table(placement, topo, nbytes)
    for l in range(L):
        e = experts[:, l, :]
        if served is not None:
            dev = served[:, l, :].reshape(-1).astype(np.int64)
        else:
            dev = (table[l][home[:, l][:, None], e] if by_home else table[l][e]).reshape(-1).astype(np.int64)
        copies[:, l, :] = np.bincount(sample * G + dev, minlength=S * G).reshape(S, G)
        key = (sample * G + dev) * N + e.reshape(-1)
        act = np.bincount(key, minlength=S * G * N).reshape(S, G, N) > 0
        active[:, l, :] = act.sum(axis=2)
    return copies, active


@dataclass
class StepSamples:
    """The sampled batches of a step table before compute is priced: comm, a2a float64[B, MAX_S]
    (simulated, independent of the accelerator's compute), count int64[B], lar, and per
    tabulated bucket b its (b, copies, active) float64[S, L, G] (`expert_loads`). `table` prices
    the experts with a roofline; the plan's sensitivity (compute x 1.3 / 0.7) re-prices the same
    samples instead of simulating them again (forecast.Forecaster.prepare caches them)."""

    sizes: np.ndarray
    comm: np.ndarray
    a2a: np.ndarray
    count: np.ndarray
    lar: float | None
    loads: list

    def table(self, roofline: Roofline) -> StepTable:
        expert = np.zeros_like(self.comm)
        for b, c, a in self.loads:
            expert[b, :c.shape[0]] = roofline.expert_seconds(c, a)
        return StepTable(self.sizes, self.comm, expert, self.count, self.lar, self.a2a)


def sample_steps(experts: np.ndarray, home: np.ndarray | None, placement: Placement,
                 topo: Topology, pipeline: Pipeline, opts: SimOptions, max_tokens: int,
                 seed: int = 0, sample_tokens: int | None = None,
                 top_only: bool = False) -> StepSamples:
    """The batches of `build_step_table`, simulated, before the roofline prices the experts.
    top_only: the largest bucket alone (what `forecast.Prepared.capacity`, the plan's screen,
    reads: an iteration at the full token budget); the other rows stay empty (count 0) and
    only `StepTable.mean` at the largest size is defined."""
    rng = np.random.default_rng(seed)
    T = experts.shape[0]
    nb = int(np.ceil(np.log2(max(2, max_tokens)))) + 1
    sizes = 2 ** np.arange(nb, dtype=np.int64)
    comm = np.zeros((nb, MAX_S))
    a2a = np.zeros((nb, MAX_S))
    count = np.zeros(nb, np.int64)
    loads = []
    lar_num = lar_den = 0.0
    for b, n in enumerate(sizes.tolist()):
        if top_only and b < nb - 1:
            continue
        S = int(np.clip((sample_tokens or SAMPLE_TOKENS) // n, MIN_S, MAX_S))
        idx = rng.choice(T, S * n, replace=S * n > T)
        ex = np.ascontiguousarray(experts[idx])
        h = None if home is None else np.ascontiguousarray(home[idx])
        served = dispatched(ex, h, placement, n, pipeline.expert_parallel)
        res = simulate(ex, h, placement, topo, pipeline, replace(opts, batch=n), served)
        comm[b, :S] = res["per_batch"]["comm_seconds"]
        a2a[b, :S] = res["per_batch"]["a2a_seconds"]
        c, a = expert_loads(ex, h, placement, topo, opts.token_bytes, S, n,
                            pipeline.expert_parallel, served)
        loads.append((b, c, a))
        count[b] = S
        if res["total"]["lar_mean"] is not None:
            lar_num += res["total"]["lar_mean"] * S * n
            lar_den += S * n
    return StepSamples(sizes, comm, a2a, count, lar_num / lar_den if lar_den else None, loads)


def build_step_table(experts: np.ndarray, home: np.ndarray | None, placement: Placement,
                     topo: Topology, pipeline: Pipeline, opts: SimOptions, roofline: Roofline,
                     max_tokens: int, seed: int = 0, sample_tokens: int | None = None,
                     top_only: bool = False) -> StepTable:
    """Tabulate buckets 1, 2, 4, ... up to the first power of two >= max_tokens (`top_only`:
    the largest alone, `sample_steps`).

    experts int[T, L, k] and home int32[T, L] (None without expert parallelism): the simulated
    split's routing and the homes the system gives its tokens."""
    return sample_steps(experts, home, placement, topo, pipeline, opts, max_tokens, seed,
                        sample_tokens, top_only).table(roofline)
