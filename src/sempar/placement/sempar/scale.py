"""The large-trace path of the `sempar` solver: a cheaper start, token step and expert search.

Size rule: a fit trace with more than `SCALE_TOKEN_LAYERS` (token occurrences x MoE layers,
8M) takes this path; below it (the tiny models' traces: 0.35M at fit 20%, 1.7M whole; the
planted tests; bench_placement's olmoe preset, 0.3M) `sempar` runs unchanged. Qwen3-30B-A3B at
1M tokens is 48M, DeepSeek-V3 at 2M tokens 116M. What changes, per MoE layer (tp mode):

- fit statistics of the load model from a seeded sample of at most `SCALE_REQUESTS` fit
  requests: the request counts X [R_s, N] and the resampling spread Sigma (`load_spread`,
  scaled by R / R_s, an unbiased estimate of the sum over all requests); the loads themselves
  stay exact (column sums of the layer's counts C);
- start: no METIS (`graph_baselines.metis_layer` partitions the whole U + N token-expert graph
  per layer); a greedy co-activation start instead, from the sampled requests: A = X^T X
  (experts used by the same requests; the token-level C^T C sparse product cost 0.3 s a layer
  at Qwen3's shape), normalised A[e, f] / sqrt(load_e load_f) so hot experts do not pull
  everything; each device's slots are filled in turn, the first with the heaviest expert left
  (of the slot's expert group), each next with the expert left of that group that is most
  co-activated with those already there. Tokens start on the device holding most of their
  activations (no capacity: the first expert step only needs their affinities);
- token step: each device takes at most 1/G of the fit occurrences (weight a_u, one capacity
  for the whole fit trace) instead of the per-pseudo-batch Lagrangian (`batch_priced_assign`,
  80 price steps over SHUFFLES x T / BATCH batches), by `SparseLocal`: the proposal rounds of
  `sempar_solver.capacitated_assign` over each token's non-zero local activations only (a token's
  activations touch about 10 experts, so its later preferences are ties at 0: the dense U x G
  partial sort cost 0.26 s a call at DeepSeek-V3's shape), at most `SCALE_TOKEN_ROUNDS` rounds,
  leftovers to the roomiest devices;
- expert step: `SCALE_PRICE_STEPS` Hungarian solves (not PRICE_STEPS), swaps only on the
  `SCALE_POLISH` best candidates and at most `SCALE_SWAPS` swaps each (each swap is an O(N^2)
  scan; unbounded it is SWAP_LIMIT x N scans); at most `SCALE_ROUNDS` alternations, stopping
  early when a round gains less than `SCALE_STOP_GAIN` of the fit objective. Device load
  variances 1_S^T Sigma 1_S gathered from each device's experts (`ScaledLoadModel`), not an
  N x N x G product.

The balance cap is the same constraint; only the search is shorter.

Measured (benchmarks/bench_placement_scale.py --methods sempar, the 2-core dev machine;
docs/placement.md, "Scale", has the table with the loaded runs). The layers run in forked workers
(`sempar_solver`'s "Workers", `layer_pool`), the counting reuses its buffers, BLAS keeps one
thread. Qwen3-30B-A3B shape, 1M tokens, EP 8 (`SCALE_SPARSE_DEVICES` keeps the dense token step
there: the sparse one was slower at 8 devices and lost fit LAR): 15.5 s wall / 29.0 s CPU at
load 1.3-1.5, 2.93 GB RSS summed over the process and its workers (1.35 GB PSS); one process:
26.5 s CPU. DeepSeek-V3 shape, 2M tokens, EP 64 as 8 x 8 (this path): 45.9 s wall / 84.5 s CPU,
4.50 GB RSS sum (2.12 GB PSS) at load 1.4-1.9; of a cProfile run's 103 s CPU, 80 s in the
workers and 23 s in the main process, 27 s of whose wall time is `nodes.device_affinity` (the
node grouping after the solve, serial). Where Qwen3's layer work goes (cProfile, one process,
load 5, 47 s in all): the layer's counts 11.8 s (a gather of the token-sorted selections 3.0 s,
then chunked bincounts), the token step 10.5 s (proposal rounds 4.9 s), the expert step's
Hungarian solves and swap search 10.3 s; the third alternation still gains 0.75 % of the fit
objective, so the rounds stay.
"""

from __future__ import annotations

import numpy as np

from sempar.placement.capacity import place_leftovers, proposal_rounds
from sempar.placement.sempar.load import LoadModel

SCALE_TOKEN_LAYERS = 8_000_000
SCALE_ROUNDS = 3
SCALE_PRICE_STEPS = 6
SCALE_POLISH = 1
SCALE_SWAPS = 16
# Up to this many devices the token step stays dense and the expert search longer (8 Hungarian
# solves, 2 candidates polished, 32 swaps each, no early stop): at Qwen3's shape, EP 8, the
# sparse step and the shorter search saved no CPU (9.6 s against 9.1 s on 12 layers) and lost
# fit LAR (0.3634 against 0.3662).
SCALE_SPARSE_DEVICES = 16
SCALE_REQUESTS = 1024
SCALE_TOKEN_ROUNDS = 8
SCALE_STOP_GAIN = 2e-3    # alternations stop when the fit objective gains less than this share


def is_large(num_occurrences: int, num_layers: int) -> bool:
    """Whether a fit trace takes the large-trace path (module docstring)."""
    return num_occurrences * num_layers > SCALE_TOKEN_LAYERS


def expert_bounds(G: int) -> dict:
    """Keyword bounds for `sempar_experts.expert_step` on the large-trace path (and, in
    `sempar_solver`, wherever there are more than FULL_SEARCH_EXPERTS experts)."""
    if G <= SCALE_SPARSE_DEVICES:
        return {"price_steps": 8, "polish": 2, "max_swaps": 32}
    return {"price_steps": SCALE_PRICE_STEPS, "polish": SCALE_POLISH, "max_swaps": SCALE_SWAPS}


def step_bounds(G: int) -> dict:
    """Keyword bounds for `sempar_solver.alternate` on the large-trace path: the alternations
    and `expert_bounds`."""
    rounds = {"rounds": SCALE_ROUNDS}
    if G > SCALE_SPARSE_DEVICES:
        rounds["stop_gain"] = SCALE_STOP_GAIN
    return {**rounds, **expert_bounds(G)}


class SparseLocal:
    """Each token's local activations per device, kept sparse, with its preference order.

    C CSR[U, N]: the layer's counts; dev int[N]: each expert's device. `indptr` int64[U + 1],
    `col` int32[nnz] device and `val` float64[nnz] activations of row u's non-zero entries
    in [indptr[u], indptr[u + 1]), sorted by activations descending, then device id (a token
    touches about 10 experts, so nnz is about 10 U, not U x G)."""

    def __init__(self, C, dev: np.ndarray, G: int):
        from scipy import sparse

        U, N = C.shape
        P = sparse.csr_matrix((np.ones(N, np.float32), (np.arange(N), dev)), shape=(N, G))
        Lc = (C @ P).tocsr()                              # duplicates summed: one entry a device
        self.indptr = Lc.indptr.astype(np.int64)
        row = np.repeat(np.arange(U, dtype=np.int64), np.diff(self.indptr))
        val = Lc.data.astype(np.int64)                    # exact integer counts
        top = int(val.max(initial=0)) + 1
        # rows ascending (already), then activations descending, then device: one integer key
        order = np.argsort((row * top + (top - 1 - val)) * G + Lc.indices, kind="stable")
        self.col, self.val = Lc.indices[order], val[order].astype(np.float64)
        self.row = row

    def first(self) -> np.ndarray:
        """int64[U]: each token's best device (uncapacitated)."""
        return self.col[self.indptr[:-1]].astype(np.int64)

    def total(self, items: np.ndarray) -> float:
        """Local activations of the tokens on devices items int[U]."""
        return float(self.val[self.col == items[self.row]].sum())

    def assign(self, a: np.ndarray, cap: np.ndarray, rounds: int = SCALE_TOKEN_ROUNDS) -> np.ndarray:
        """int64[U]: device of each token under per-device capacities cap float[G] on the
        weights a float[U]: `capacity.proposal_rounds` (round r: each unplaced token asks its
        r-th best device; a device takes its askers by local share while they fit), only over
        each token's non-zero preferences; then `capacity.place_leftovers` (heaviest first into
        the roomiest devices)."""
        U = a.size
        width = np.diff(self.indptr)
        R = int(min(rounds, width.max(initial=0)))
        pref = np.full((U, R), -1, np.int64)
        prio = np.zeros((U, R))
        for r in range(R):
            has = np.flatnonzero(width > r)
            at = self.indptr[has] + r
            pref[has, r], prio[has, r] = self.col[at], self.val[at] / a[has]
        out, room = proposal_rounds(pref, prio, cap, a)
        place_leftovers(out, a, room)
        return out


class RequestSample:
    """A seeded sample of at most `SCALE_REQUESTS` fit requests: `rows` int64[T_s] their
    occurrences, `req` int64[T_s] their index in the sample, `size` R_s and `scale` R / R_s."""

    def __init__(self, request_index: np.ndarray, R: int, seed: int):
        rng = np.random.default_rng([seed, 0x5CA1E])
        pick = np.sort(rng.choice(R, min(R, SCALE_REQUESTS), replace=False))
        where = np.full(R, -1, np.int64)
        where[pick] = np.arange(pick.size)
        self.rows = np.flatnonzero(where[request_index] >= 0)
        self.req = where[request_index[self.rows]]
        self.size, self.scale = int(pick.size), R / pick.size

    def counts(self, experts: np.ndarray, N: int) -> np.ndarray:
        """float64[R_s, N]: activations of each expert by each sampled request at one layer;
        experts int[T, k]: the layer's selections of every fit occurrence."""
        key = self.req[:, None] * N + experts[self.rows]
        return np.bincount(key.ravel(), minlength=self.size * N).reshape(self.size, N) \
            .astype(np.float64)


def greedy_start(gram: np.ndarray, load: np.ndarray, slot_group: np.ndarray,
                 expert_group: np.ndarray) -> np.ndarray:
    """int64[N]: a start placement from co-activation (module docstring).

    gram float64[N, N]: X^T X of the sampled requests' activations per expert X [R_s, N] (not
    changed); load float[N]: activations per expert; slot_group int[G, S]: expert group of each
    slot; expert_group int[N]."""
    G, S = slot_group.shape
    N = load.size
    A = gram.copy()
    np.fill_diagonal(A, 0.0)
    norm = np.sqrt(np.maximum(load, 1e-12))
    A /= norm[:, None] * norm[None, :]
    free = np.ones(N, bool)
    dev = np.full(N, -1, np.int64)
    for d in range(G):
        members: list[int] = []
        pull = np.zeros(N)                               # co-activation with the device so far
        for j in range(S):
            pool = free & (expert_group == slot_group[d, j])
            if members:
                score = np.where(pool, pull, -np.inf)
            else:
                score = np.where(pool, load, -np.inf)
            e = int(np.argmax(score))
            members.append(e)
            pull = pull + A[e]
            free[e] = False
            dev[e] = d
    return dev


class ScaledLoadModel(LoadModel):
    """`LoadModel` whose per-device sums of Sigma are gathered from each device's N/G experts
    (N x G x N/G reads, not an N x N x G product); the same values up to rounding."""

    def by_device(self, dev: np.ndarray, G: int) -> np.ndarray:
        counts = np.bincount(dev, minlength=G)
        if counts.min() != counts.max():                 # unequal devices: the plain product
            return super().by_device(dev, G)
        members = np.argsort(dev, kind="stable").reshape(G, -1)                  # [G, N/G]
        return self.sigma[:, members].sum(axis=2)

    def of(self, dev: np.ndarray, G: int) -> np.ndarray:
        L = np.bincount(dev, weights=self.load, minlength=G)
        if self.sigma is None:
            return L
        S = self.by_device(dev, G)
        V = np.bincount(dev, weights=S[np.arange(dev.size), dev], minlength=G)
        return L + np.sqrt(np.maximum(V, 0.0)) - self.offset
