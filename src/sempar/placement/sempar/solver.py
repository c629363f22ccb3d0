"""`sempar`: our placement solver: local AND balanced, balance a hard cap, the rest to locality.

Not a paper's algorithm (the faithful Sem-MoE baseline is `semmoe`, whose load term in the
score swamps its affinity terms and whose objective is dp's whatever the mode). Here

- **balance is a constraint**: at every MoE layer each device's expert load (fit activations
  it serves) is at most `max_imbalance` x the mean (default 1.05, `--max-imbalance`);
- **the objective follows the mode** and is built from real co-activation counts
  c[l, u, e] (`AffinityStats.counts`, not Cp^T diag(a) Cp):
  - tp: local activations per (token, layer): token u sits on device x[l, u] and
    sum_u c[l, u, e] over experts e hosted there counts; each device takes at most
    (1 + TOKEN_SLACK) x 1/G of the fit occurrences (tp mode's equal per-batch capacity, Sem-MoE
    Alg. 3's align step);
  - dp: local activations per request: request r sits on rank z[r] for every layer, equal
    request counts per rank (Alg. 2 gives each rank one request per round);
- **search** (per layer in tp, all layers tied through the requests in dp): start from METIS
  (`graph_baselines.metis_layer`, the s-MoE §5.7 baseline), then alternate exact steps:
  1. tokens (requests) given experts: the capacitated assignment maximising local activations
     (`capacitated_assign` here; tp's per-batch capacity in `sempar_tokens`), solved by
     proposal rounds (each unplaced item asks its next-best device; a device with room takes
     the askers with the highest local share first);
  2. experts given tokens (`sempar_experts`): maximise sum W[d, e] over hosted (e, d),
     W[d, e] = activations of e by the tokens on d, with N/G experts per device and the load cap: a min-cost assignment of
     experts to slots (Hungarian, `scipy.optimize.linear_sum_assignment`) with Lagrangian load
     prices mu_d updated by subgradient, then best-improvement pairwise swaps with exact gain
     that keep every device under the cap (and swaps that cut the overload first, if any);
  until the fit objective stops improving (at most `ROUNDS`). Deterministic given the seed.
- **replicas** (`sempar_replicas`; `--redundant R`, R a multiple of G so that devices keep equal
  slots): after the primary placement every device gets R/G extra slots, one (expert, device)
  pair at a time, device loads computed with the evaluator's serving rule (home replica, else
  same-node replica, else lowest device id) plus the primary's resampling spread carried to
  the served shares: in tp mode balance first (while the peak is above the replica cap, the
  pair that lowers it most, ties by fit activations made local W[d, e]), then locality under
  the cap, tokens re-assigned against the replicated hosts, then up to two rounds of a
  balancing pass (`sempar_replicas.balance_pass`: slot swaps that lower the peak robust served
  load, the least locality lost per unit of peak lowered; a round is kept only if the peak
  stays lower once the tokens follow the swaps), and where the robust fit peak stays above the
  cap, the same again with the layer's hottest expert first on every device, the more balanced
  of the two kept (`sempar_replicas.TP_HOT_FALLBACK`); in dp mode the hottest expert of each layer
  (fit activations) is put on every device first (`sempar_replicas.dp_hot`: local to every
  request, its load split by the requests' ranks), so the alternation of requests and experts
  runs without it, then the slots left go locality first (any pair that does not raise the
  peak; balance first there measured below eplb's LAR: tiny-moe64 R = G EP 4 0.304 at 1.028,
  EP 8 0.162 at 1.085). A tighter primary cap
  (`sempar_replicas.REPLICA_SLACK`, the share of the headroom above the mean the primary keeps;
  1.0, the full cap, here) trades LAR for held-out balance (below).
- **--preserve-groups**: expert e may only fill a slot of its own expert group's slot range
  (group g = experts [g N / ng, (g + 1) N / ng), slots likewise), so a checkpoint can be
  permuted within groups; the Hungarian costs forbid other slots and swaps stay in a group.
- nodes: devices are relabelled afterwards by `base.solve` (nodes.py), like every co-clustering
  solver.

Measured (benchmarks/bench_placement.py, tiny-moe64, fit 20% / eval 80% by request, machine
heavily loaded): tp EP 4 LAR 0.412 at imbalance 1.055 (90% of its capacity-bound oracle 0.458;
metis 0.367 at 1.14, semmoe 0.355 at 1.04); dp EP 4 0.286 at 1.055 (semmoe 0.264). R = G
replicas, tp, held out (machine loaded): EP 4 0.409 at imbalance 1.031 (eplb 0.306 at 1.13:
1.34x), EP 8 0.253 at 1.039 (eplb 0.175 at 1.34: 1.45x); without the balancing pass 0.430 at
1.047 / 0.2725 at 1.080 (fit 1.040 at EP 8: the drift is the experts' own held-out load,
largest on devices grouping experts that the same requests use, which the pass's robust loads
charge; a placement balancing fit loads only, LPT, reaches 1.027 / 1.036 held out at EP 4 / 8).
REPLICA_SLACK 0.5 (primary cap 1.025 x mean, no pass): EP 4 0.4185 at 1.041, EP 8 0.2607 at
1.075. dp mode, R = G: EP 4 0.344 at 1.064, EP 8 0.212 at 1.132 (eplb 0.305 / 0.175: 1.13x /
1.21x; locality-first replicas without the hot expert: 0.310 at 1.059 / 0.181 at 1.131).
Planted instances (tests/test_sempar_solver.py) are recovered to >= 99%.

Limits: the fit cap holds on fit loads (tested); held out, imbalance drifts 0.005-0.05 above it
(more with replicas, whose served loads depend on where tokens end up).

Size rule: a fit trace with more than `sempar_scale.SCALE_TOKEN_LAYERS` token occurrences x
MoE layers (8M; tiny models 1.7M, Qwen3-30B-A3B at 1M tokens 48M) takes the large-trace path
in tp mode (placement/sempar/scale.py: request-sampled load model, greedy co-activation start
instead of per-layer METIS, one-capacity token step, bounded expert search); below it
everything above runs unchanged. dp mode has no large-trace path.

Workers: tp mode's layers are independent (`_solve_tp_layer`), so on the large-trace path they
run in `PlacementProblem.jobs` forked worker processes (`layer_pool.map_layers`; `place
--jobs`, default the usable CPUs), with the serial run's result bit for bit (tested). Below the
size rule they run in-process: on the tiny models' fit traces two workers saved 2-3 s of 9-10 s
on tiny-moe64 and lost 0.6 s of 2 s on tiny-mixtral (2-core machine at load 3), and the test
suite solves many small traces.

Outputs: the placement and its `token_table` (token -> device per layer: in tp mode the
capacitated assignment, in dp mode the device holding most of the token's activations), the fit
request clusters in dp mode, and the fit objective per layer. `DP_TOKEN_TABLE` "requests" puts
each token instead on the rank where most of its fit requests went (Sem-MoE Alg. 1's label from
request clusters), same on every layer; measured dp EP 4 (held-out LAR): tiny-mixtral 0.2604
against 0.2579 with "share" (metis 0.2585; no method within imbalance 1.10 there), tiny-moe64
0.2845 against 0.286, so "share" stays the default.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from sempar.errors import InputError
from sempar.affinity.routing_stats import BLOCK_LAYERS, AffinityStats
from sempar.placement.capacity import place_leftovers, proposal_rounds
from sempar.placement.base import (SOLVERS, PlacementProblem, coclustered_placement,
                                   slot_groups, token_table_row)
from sempar.placement.graph_baselines import metis_layer
from sempar.placement.sempar._pool import map_layers, usable_cpus
from sempar.placement.placement import Placement, RequestClusters
from sempar.placement.sempar import replicas as sempar_replicas, scale as sempar_scale
from sempar.placement.sempar.load import LoadModel, onehot, load_spread
from sempar.placement.sempar.experts import expert_step
from sempar.placement.sempar.replicas import replicated_placement
from sempar.placement.sempar.tokens import SHUFFLES, batch_priced_assign, pseudo_batches

ROUNDS = 12             # alternations at most (ours: the tiny-moe64 objective settles in 4-8)
DP_TOKEN_TABLE = "share"   # dp token table: "share" (most activations) or "requests" (docstring)
TOKEN_SLACK = 0.0       # tokens of a device may exceed 1/G of the fit occurrences by this share
# Above this many experts the expert step is bounded like the large-trace path's
# (`sempar_scale.step_bounds`) whatever the trace size: each swap scans N^2 pairs, so the full
# search grows as N^3 per candidate. Qwen3-30B-A3B shape (128 experts), 3,000 tokens, EP 8, tp,
# held out: bounded 0.1863 LAR at 1.283 in 9.9 s, full 0.1860 at 1.277 in 356.6 s; a
# 1,200-token DeepSeek-V3-shaped trace (256 experts) did not finish a layer's full search in
# minutes. tiny-moe64 and OLMoE (64 experts) keep the full search.
FULL_SEARCH_EXPERTS = 64


# ----------------------------------------------------------------------------- item assignment

def capacitated_assign(value: np.ndarray, weight: np.ndarray, cap: np.ndarray,
                       max_rounds: int | None = None) -> np.ndarray:
    """int64[n]: device of each item maximising the summed value under per-device capacities.

    value float[n, G]: what item i gains on device d (ordered by value per unit weight);
    weight float[n] > 0; cap float[G]. Proposal rounds: in round r each unplaced item asks its
    r-th best device; a device takes its askers, best value per weight first, while they fit.
    Items that fit nowhere go to the device with the most room left. `max_rounds` (the
    large-trace path, `sempar_scale`): only that many rounds, on each item's top preferences
    (a partial sort), and the leftovers, heaviest first, fill the roomiest devices in turn;
    None: G rounds on a full sort.
    """
    n, G = value.shape
    dens = value / weight[:, None]
    rounds = G if max_rounds is None else min(G, max_rounds)
    if rounds < G:
        top = np.argpartition(-dens, rounds - 1, axis=1)[:, :rounds]
        pref = np.take_along_axis(top, np.argsort(-np.take_along_axis(dens, top, axis=1),
                                                  axis=1, kind="stable"), axis=1)
    else:
        pref = np.argsort(-dens, axis=1, kind="stable")
    out, room = proposal_rounds(pref, np.take_along_axis(dens, pref, axis=1), cap, weight)
    place_leftovers(out, weight, room, roomiest=max_rounds is not None)
    return out

# ------------------------------------------------------------------------------------ solver

def request_counts(stats: AffinityStats, l: int) -> np.ndarray:
    """float32[R, N]: activations of each expert by each fit request at layer l (real counts)."""
    R, N = stats.R, stats.N
    key = stats.request_index[:, None] * N + stats.trace.experts[:, l]
    return np.bincount(key.ravel(), minlength=R * N).reshape(R, N).astype(np.float32)


def alternate(M, step, lm: LoadModel, slot_group: np.ndarray, expert_group: np.ndarray,
              items: np.ndarray, dev: np.ndarray | None = None, rounds: int = ROUNDS,
              stop_gain: float = 1e-6, **step_bounds) -> tuple[np.ndarray, np.ndarray, float]:
    """(expert device int64[N], item device int64[n], fit local activations) for one layer.

    M [n, N] (dense or CSR): activations of expert e by item i (tokens in tp mode); step:
    (M, expert device int[N]) -> (item device int[n], local activations), the items' step under
    their capacity rule; lm: loads and cap; items int[n]: a starting item clustering; dev: a
    starting expert placement (used when it respects the groups); rounds, stop_gain (stop when
    a round gains less than this share) and step_bounds (`expert_step`'s bounds): the
    large-trace path's shorter search."""
    G = lm.cap_devices
    best = None
    for _ in range(rounds):
        W = np.asarray((M.T @ onehot(items, G))).T                       # [G, N]
        dev = expert_step(W, lm, slot_group, expert_group,
                          dev if dev is not None and _in_groups(dev, slot_group, expert_group)
                          else None, **step_bounds)
        items, obj = step(M, dev)
        if best is not None and obj <= best[2] * (1 + stop_gain):
            if obj > best[2]:
                best = (dev.copy(), items.copy(), obj)
            break
        best = (dev.copy(), items.copy(), obj)
    return best


def dense_step(assign, G: int):
    """An `alternate` step from a rule assign: local float[n, G] -> int[n] on the dense table
    local = M @ onehot(dev)."""
    def step(M, dev: np.ndarray) -> tuple[np.ndarray, float]:
        local = np.asarray(M @ onehot(dev, G))                           # [n, G]
        items = assign(local)
        return items, float(local[np.arange(items.size), items].sum())
    return step


def _in_groups(dev: np.ndarray, slot_group: np.ndarray, expert_group: np.ndarray) -> bool:
    G, S = slot_group.shape
    want = np.stack([np.bincount(slot_group[d], minlength=int(expert_group.max()) + 1)
                     for d in range(G)])
    have = np.zeros_like(want)
    np.add.at(have, (dev, expert_group), 1)
    return bool(np.array_equal(want, have))


@SOLVERS.register("sempar", replicas=True, preserves_groups=True, mode_aware=True)
def sempar(p: PlacementProblem) -> Placement:
    """Ours: locality under a hard per-layer balance cap, mode-aware (module docstring)."""
    meta = p.trace.meta
    L, N, G = meta.num_layers, meta.num_experts, p.num_devices
    if N % G:
        raise InputError(f"sempar: {N} experts do not split evenly over {G} devices")
    if p.redundant % G:
        raise InputError(f"sempar: --redundant {p.redundant} is not a multiple of the {G} devices "
                         f"(every device takes the same number of replicas)")
    if p.redundant and p.preserve_groups:
        raise InputError("sempar: --preserve-groups with --redundant: replicas have no group slots")
    stats = AffinityStats(p.trace)
    slot_group, expert_group = slot_groups(p)
    imb = p.max_imbalance if not p.redundant else 1 + sempar_replicas.REPLICA_SLACK * (
        p.max_imbalance - 1)                      # the primary's cap (REPLICA_SLACK's comment)

    def model(X: np.ndarray) -> LoadModel:
        load = X.sum(axis=0, dtype=np.float64)
        return LoadModel(load, load_spread(X.astype(np.float64), load), imb * load.sum() / G, G)
    node_of = p.node_of()
    allowed = np.ones((G, N), bool)
    if p.mode == "dp":
        return _solve_dp(p, stats, slot_group, expert_group, model, node_of, allowed)
    large = sempar_scale.is_large(stats.token_index.size, L)
    if large:                     # the large-trace path: sempar_scale's docstring
        tok_cap = np.full(G, (1 + TOKEN_SLACK) * stats.a.sum() / G)
        assign = lambda local: capacitated_assign(                                # noqa: E731
            local, stats.a, tok_cap, sempar_scale.SCALE_TOKEN_ROUNDS)

        sparse = G > sempar_scale.SCALE_SPARSE_DEVICES

        def step(C, dev: np.ndarray) -> tuple[np.ndarray, float]:
            if not sparse:
                return dense_step(assign, G)(C, dev)
            sl = sempar_scale.SparseLocal(C, dev, G)
            items = sl.assign(stats.a, tok_cap)
            return items, sl.total(items)
        bounds = sempar_scale.step_bounds(G)
        sample = sempar_scale.RequestSample(stats.request_index, stats.R, p.seed)
    else:
        sparse, sample = False, None
        occ, size = pseudo_batches(stats, p.seed)
        assign = lambda local: batch_priced_assign(local, occ, size, SHUFFLES)     # noqa: E731
        step = dense_step(assign, G)
        bounds = sempar_scale.step_bounds(G) if N > FULL_SEARCH_EXPERTS else {}
    layer = partial(_solve_tp_layer, stats=stats, p=p, large=large, sparse=sparse,
                    sample=sample, imb=imb, model=model, step=step,
                    assign=assign, bounds=bounds, slot_group=slot_group,
                    expert_group=expert_group, node_of=node_of, allowed=allowed)
    jobs = min(L, usable_cpus() if p.jobs is None else p.jobs) if large else 1
    out = map_layers(layer, L, jobs, BLOCK_LAYERS)
    devs, toks, objs, hosts_all, rows = (list(x) for x in zip(*out))
    info = {"mode": "tp", "max_imbalance": p.max_imbalance, "fit_local_activations": objs,
            "preserve_groups": p.preserve_groups, "large_trace_path": large}
    if p.redundant:
        return replicated_placement(p, "sempar", np.stack(devs), hosts_all, stats,
                                    np.stack(toks), info)
    return coclustered_placement(p, "sempar", np.stack(devs), stats, np.stack(toks), info,
                                 rows=rows)


def _solve_tp_layer(l: int, *, stats: AffinityStats, p: PlacementProblem, large: bool,
                    sparse: bool, sample, imb: float, model, step, assign, bounds: dict,
                    slot_group, expert_group, node_of, allowed):
    """tp mode, MoE layer l (layers are independent there; `layer_pool` may run them in
    forked workers): (expert device int64[N], token device int64[U], fit local activations,
    hosts bool[G, N] or None, token table row (`base.token_table_row`) or None)."""
    N, G = stats.N, p.num_devices
    C = stats.counts(l)
    if large:
        X = sample.counts(stats.trace.experts[:, l], N)
        load = np.asarray(C.sum(axis=0), np.float64).ravel()
        gram = X.T @ X
        lm = sempar_scale.ScaledLoadModel(
            load, sample.scale * load_spread(X, X.sum(axis=0), gram), imb * load.sum() / G, G)
        edev = sempar_scale.greedy_start(gram, load, slot_group, expert_group)
        etok = (sempar_scale.SparseLocal(C, edev, G).first() if sparse    # uncapacitated
                else np.argmax(np.asarray(C @ onehot(edev, G)), axis=1))
    else:
        lm = model(request_counts(stats, l))
        edev, etok, _, _ = metis_layer(C.toarray().astype(np.int64), stats.a, G, p.seed)
    dev, items, obj = alternate(C, step, lm, slot_group, expert_group, etok, edev,
                                **bounds)
    if p.redundant:
        h, items = sempar_replicas.tp_replicas(C, dev, items, assign, lm, p.redundant // G,
                                               node_of, allowed)
        return dev, items, obj, h, None        # replicated_placement counts layer l again
    row = token_table_row(stats, l, dev, G, items)
    stats.forget(l)                            # nothing reads layer l's counts after this
    return dev, items, obj, None, row


def _solve_dp(p: PlacementProblem, stats: AffinityStats, slot_group, expert_group, model,
              node_of, allowed) -> Placement:
    """dp mode: requests (one rank for all layers) and every layer's experts, alternated."""
    from sempar.placement.semmoe import _initial_requests, request_features

    L, G, R = stats.L, p.num_devices, stats.R
    full = [request_counts(stats, l) for l in range(L)]                              # [R, N] each
    hot = [sempar_replicas.dp_hot(q, G, p.redundant) for q in full]
    Q = [sempar_replicas.without(q, h) for q, h in zip(full, hot)]   # hot experts: local anywhere
    lms = [model(q) for q in Q]
    feats, _ = request_features(np.stack(full), p.seed)
    z = _initial_requests(feats, G, p.seed)
    ones = np.ones(R)
    rcap = np.full(G, float(-(-R // G)))
    devs = [None] * L
    best = None
    bounds = sempar_scale.expert_bounds(G) if stats.N > FULL_SEARCH_EXPERTS else {}
    for _ in range(ROUNDS):
        oz = onehot(z, G)
        for l in range(L):
            W = (Q[l].T @ oz).T.astype(np.float64)
            start = devs[l] if devs[l] is not None and _in_groups(devs[l], slot_group,
                                                                   expert_group) else None
            devs[l] = expert_step(W, lms[l], slot_group, expert_group, start, **bounds)
        score = sum(Q[l] @ onehot(devs[l], G) for l in range(L)).astype(np.float64)
        z = capacitated_assign(score, ones, rcap)
        obj = float(score[np.arange(R), z].sum())
        if best is not None and obj <= best[2] * (1 + 1e-6):
            break
        best = ([d.copy() for d in devs], z.copy(), obj)
    devs, z, obj = best
    info = {"mode": "dp", "max_imbalance": p.max_imbalance, "fit_local_activations": obj,
            "preserve_groups": p.preserve_groups}
    clusters = RequestClusters(stats.reqs, z)
    if not p.redundant:
        tdev = None
        if DP_TOKEN_TABLE == "requests":
            votes = np.asarray(stats.request_tokens().T @ onehot(z, G))                # [U, G]
            tdev = np.tile(votes.argmax(axis=1), (L, 1))
        return coclustered_placement(p, "sempar", np.stack(devs), stats, tdev, info=info,
                                     request_cluster=clusters)
    hosts = [sempar_replicas.dp_replicas(full[l], devs[l], z, lms[l], p.redundant // G, node_of,
                                         allowed, hot[l]) for l in range(L)]
    return replicated_placement(p, "sempar", np.stack(devs), hosts, stats, None, info,
                                request_cluster=clusters)
