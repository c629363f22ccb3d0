"""The large-trace path of the `sempar` solver: a cheaper start, token step and expert search.

Which traces take it: `SemparConfig.large_trace`, decided by `SemparConfig.for_shape` (more than
`scale_token_layers` token occurrences x MoE layers in the fit trace, tp mode only). Below the
rule `sempar` runs its default path. The balance cap is the same constraint on both paths; only
the search is shorter. What changes, per MoE layer:

- load model: its fit statistics come from a seeded sample of at most `scale_requests` fit
  requests (`RequestSample`): the request counts X [R_s, N] and the resampling spread Sigma
  (`load_spread`, scaled by R / R_s, an unbiased estimate of the sum over all requests); the
  loads themselves stay exact (column sums of the layer's counts C). Device load variances
  1_S^T Sigma 1_S are gathered from each device's experts (`ScaledLoadModel`), not an
  N x N x G product;
- start: no METIS (`graph_baselines.metis_layer` partitions the whole U + N token-expert graph
  per layer) but a greedy co-activation start from the sampled requests (`greedy_start`):
  A = X^T X (experts used by the same requests; cheaper than the token-level C^T C),
  normalised A[e, f] / sqrt(load_e load_f) so hot experts do not pull everything; each
  device's slots are filled in turn, the first with the heaviest expert left (of the slot's
  expert group), each next with the expert left of that group most co-activated with those
  already there. Tokens start on the device holding most of their activations (no capacity:
  the first expert step only needs their affinities);
- token step: each device takes at most (1 + token_slack) / G of the fit occurrences (weight
  a_u, one capacity for the whole fit trace) instead of tp's per-pseudo-batch Lagrangian
  (`tokens.batch_priced_assign`), in at most `scale_token_rounds` proposal rounds, leftovers
  to the roomiest devices. Above `scale_sparse_devices` devices (`SemparConfig.sparse_step`)
  the rounds run over each token's non-zero local activations only (`SparseLocal`: a token's
  activations touch about k x a few experts, so its later preferences are ties at 0 and a
  dense U x G sort is wasted work);
- expert step: bounded (`expert_bounds`): fewer Hungarian solves, swaps only on the best
  candidates and at most a fixed number of swaps each (each swap is an O(N^2) scan; unbounded
  it is swap_limit x N scans); at most `scale_rounds` alternations, with the sparse step
  stopping early when a round gains less than `scale_stop_gain` of the fit objective.

The layers are independent, so the solver runs them in forked workers (`_pool.map_layers`);
nothing here keeps state between layers.
"""

from __future__ import annotations

import numpy as np

from sempar.affinity.requests import request_counts
from sempar.placement.capacity import place_leftovers, proposal_rounds
from sempar.placement.sempar.config import SemparConfig
from sempar.placement.sempar.load import LoadModel


def expert_bounds(cfg: SemparConfig) -> dict:
    """Keyword bounds (`price_steps`, `polish`, `max_swaps`) for `experts.expert_step` where the
    expert search is bounded (the large-trace path, `SemparConfig.bounded_experts`): the
    shorter `scale_*` ones with the sparse token step, else the `scale_dense_*` ones."""
    if not cfg.sparse_step:
        return {"price_steps": cfg.scale_dense_price_steps, "polish": cfg.scale_dense_polish,
                "max_swaps": cfg.scale_dense_swaps}
    return {"price_steps": cfg.scale_price_steps, "polish": cfg.scale_polish,
            "max_swaps": cfg.scale_swaps}


def step_bounds(cfg: SemparConfig) -> dict:
    """Keyword bounds for `solver.alternate` where the search is bounded: `rounds`,
    `stop_gain` and `expert_bounds`."""
    stop_gain = cfg.scale_stop_gain if cfg.sparse_step else cfg.stop_gain
    return {"rounds": cfg.scale_rounds, "stop_gain": stop_gain, **expert_bounds(cfg)}


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

    def assign(self, a: np.ndarray, cap: np.ndarray, rounds: int) -> np.ndarray:
        """int64[U]: device of each token under per-device capacities cap float[G] on the
        weights a float[U]: `capacity.proposal_rounds`, at most `rounds` of them (round r: each
        unplaced token asks its r-th best device; a device takes its askers by local share while
        they fit), only over each token's non-zero preferences; then `capacity.place_leftovers`
        (heaviest first into the roomiest devices)."""
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
    """A seeded sample of at most `size` of the R fit requests (request_index int[T]: each
    occurrence's request): `rows` int64[T_s] their occurrences, `req` int64[T_s] their index in
    the sample, `size` R_s and `scale` R / R_s."""

    def __init__(self, request_index: np.ndarray, R: int, seed: int, size: int):
        rng = np.random.default_rng([seed, 0x5CA1E])
        pick = np.sort(rng.choice(R, min(R, size), replace=False))
        where = np.full(R, -1, np.int64)
        where[pick] = np.arange(pick.size)
        self.rows = np.flatnonzero(where[request_index] >= 0)
        self.req = where[request_index[self.rows]]
        self.size, self.scale = int(pick.size), R / pick.size

    def counts(self, experts: np.ndarray, N: int) -> np.ndarray:
        """float64[R_s, N]: activations of each expert by each sampled request at one layer;
        experts int[T, k]: the layer's selections of every fit occurrence."""
        return request_counts(self.req, experts[self.rows], self.size, N).astype(np.float64)


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
