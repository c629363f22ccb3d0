"""`sempar`: our placement solver: local AND balanced, balance a hard cap, the rest to locality.

Not a paper's algorithm (the faithful Sem-MoE baseline is `semmoe`, whose load term in the
score swamps its affinity terms and whose objective is dp's whatever the mode). Here

- **balance is a constraint**: at every MoE layer each device's expert load (fit activations
  it serves, plus a robust margin for the spread a placement adds, `load.LoadModel`) is at most
  `max_imbalance` x the mean (default 1.05, `--max-imbalance`);
- **the objective follows the mode** and is built from real co-activation counts
  c[l, u, e] (`AffinityStats.counts`, not Cp^T diag(a) Cp):
  - tp: local activations per (token, layer): token u sits on device x[l, u] and
    sum_u c[l, u, e] over experts e hosted there counts; each device takes 1/G of every batch
    (tp mode's equal per-batch capacity, Sem-MoE Alg. 3's align step; `tokens`);
  - dp: local activations per request: request r sits on rank z[r] for every layer, equal
    request counts per rank (Alg. 2 gives each rank one request per round);
- **search** (per layer in tp, all layers tied through the requests in dp): start from METIS
  (`graph_baselines.metis_layer`, the s-MoE §5.7 baseline), then alternate exact steps:
  1. tokens (requests) given experts: the capacitated assignment maximising local activations
     (`capacitated_assign` here; tp's per-batch capacity in `tokens`), solved by proposal
     rounds (each unplaced item asks its next-best device; a device with room takes the
     askers with the highest local share first);
  2. experts given tokens (`experts`): maximise sum W[d, e] over hosted (e, d), W[d, e] =
     activations of e by the tokens on d, with N/G experts per device and the load cap: a
     min-cost assignment of experts to slots (Hungarian) with Lagrangian load prices, then
     best-improvement pairwise swaps with exact gain that keep every device under the cap
     (and swaps that cut the overload first, if any);
  until the fit objective stops improving (at most `SemparConfig.rounds`). Deterministic given
  the seed and the config.
- **replicas** (`replicas`; `--redundant R`, R a multiple of G so that devices keep equal
  slots): after the primary placement every device gets R/G extra slots, chosen against the
  evaluator's serving rule: tp mode balance first then locality, a balancing pass of slot
  swaps, and where balance stays out of reach a second try with the hottest expert on every
  device; dp mode puts each layer's hottest expert on every device before the primary is
  solved, then spends the slots left locality first. The primary's cap keeps
  `replica_slack` of the headroom above the mean (`replicas`' docstring).
- **--preserve-groups**: expert e may only fill a slot of its own expert group's slot range
  (group g = experts [g N / ng, (g + 1) N / ng), slots likewise), so a checkpoint can be
  permuted within groups; the Hungarian costs forbid other slots and swaps stay in a group.
- nodes: devices are relabelled afterwards by `base.solve_problem` (nodes.py), like every
  co-clustering solver.

Invariants: the fit cap holds on fit loads (tested; held out, imbalance drifts above it, more
with replicas, whose served loads depend on where tokens end up); planted instances are
recovered (tests/placement/sempar/test_sempar_solver.py).

Settings: every tuning setting is a field of `SemparConfig` (config.py); `solve("sempar", ...)`
uses `SemparConfig.for_problem(problem)`, `sempar_solve(problem, config)` any other. The
config's `large_trace` sends large fit traces (tp mode) to the large-trace path (scale.py:
request-sampled load model, greedy co-activation start instead of per-layer METIS,
one-capacity token step, bounded expert search); `bounded_experts` bounds the expert search
on the default path too where N^3 swap scans would not finish (many experts). dp mode has no
large-trace path.

Workers: tp mode's layers are independent (`_TpLayers`), so on the large-trace path they run
in `PlacementProblem.jobs` forked worker processes (`_pool.map_layers`; `place --jobs`, default
the usable CPUs), with the serial run's result bit for bit (tested). On the default path they
run in-process: there forking costs about what it saves.

Outputs: the placement and its `token_table` (token -> device per layer: in tp mode the
capacitated assignment, in dp mode the device holding most of the token's activations, or with
`dp_token_table` "requests" the rank where most of its fit requests went, same on every
layer), the fit request clusters in dp mode, and the fit objective per layer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np

from sempar.affinity.affinity_stats import AffinityStats
from sempar.errors import InputError
from sempar.placement.capacity import place_leftovers, proposal_rounds
from sempar.placement.base import (SOLVERS, PlacementProblem, coclustered_placement,
                                   slot_groups, solve_problem, token_table_row)
from sempar.placement.graph_baselines import metis_layer
from sempar.placement.sempar._pool import map_layers, usable_cpus
from sempar.placement.placement import Placement, RequestClusters
from sempar.placement.sempar import replicas as sempar_replicas, scale as sempar_scale
from sempar.placement.sempar.config import SemparConfig
from sempar.placement.sempar.load import (LoadModel, layer_load_model, layer_request_counts,
                                          load_spread, onehot)
from sempar.placement.sempar.experts import expert_step
from sempar.placement.sempar.held_out import HeldOut
from sempar.placement.sempar.hypergraph import hypergraph_start
from sempar.placement.sempar.replicas import replicated_placement
from sempar.placement.sempar.row_sets import solve_by_layer
from sempar.placement.sempar.rows import resolve_objective, solve_rows
from sempar.placement.sempar.tokens import batch_priced_assign, pseudo_batches


# ----------------------------------------------------------------------------- item assignment

def capacitated_assign(value: np.ndarray, weight: np.ndarray, cap: np.ndarray,
                       max_rounds: int | None = None) -> np.ndarray:
    """int64[n]: device of each item maximising the summed value under per-device capacities.

    value float[n, G]: what item i gains on device d (ordered by value per unit weight);
    weight float[n] > 0; cap float[G]. Proposal rounds: in round r each unplaced item asks its
    r-th best device; a device takes its askers, best value per weight first, while they fit.
    Items that fit nowhere go to the device with the most room left. `max_rounds` (the
    large-trace path, scale.py): only that many rounds, on each item's top preferences
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

def alternate(M, step, lm: LoadModel, slot_group: np.ndarray, expert_group: np.ndarray,
              items: np.ndarray, dev: np.ndarray | None, *, rounds: int, stop_gain: float,
              **expert_kw) -> tuple[np.ndarray, np.ndarray, float]:
    """(expert device int64[N], item device int64[n], fit local activations) for one layer.

    M [n, N] (dense or CSR): activations of expert e by item i (tokens in tp mode); step:
    (M, expert device int[N]) -> (item device int[n], local activations), the items' step under
    their capacity rule; lm: loads and cap; items int[n]: a starting item clustering; dev: a
    starting expert placement (used when it respects the groups); at most `rounds`
    alternations, stopping when a round gains less than `stop_gain` of the objective;
    expert_kw: `expert_step`'s settings (`_expert_settings`)."""
    G = lm.cap_devices
    best = None
    for _ in range(rounds):
        W = np.asarray((M.T @ onehot(items, G))).T                       # [G, N]
        dev = expert_step(W, lm, slot_group, expert_group,
                          dev if dev is not None and _in_groups(dev, slot_group, expert_group)
                          else None, **expert_kw)
        items, obj = step(M, dev)
        if best is not None and obj <= best[2] * (1 + stop_gain):
            if obj > best[2]:
                best = (dev.copy(), items.copy(), obj)
            break
        best = (dev.copy(), items.copy(), obj)
    return best


def _expert_settings(cfg: SemparConfig, bounded: bool) -> dict:
    """`expert_step`'s keyword settings: the bounded search (`scale.expert_bounds`) or the
    full one."""
    if bounded:
        return {"swap_limit": cfg.swap_limit, **sempar_scale.expert_bounds(cfg)}
    return {"swap_limit": cfg.swap_limit, "price_steps": cfg.price_steps}


def alternation_settings(cfg: SemparConfig, bounded: bool) -> dict:
    """`alternate`'s keyword settings: the bounded search (`scale.step_bounds`) or the full
    one."""
    if bounded:
        return {"swap_limit": cfg.swap_limit, **sempar_scale.step_bounds(cfg)}
    return {"rounds": cfg.rounds, "stop_gain": cfg.stop_gain, **_expert_settings(cfg, False)}


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


def sempar_solve(problem: PlacementProblem, config: SemparConfig | None = None, *,
                 mapper: Callable = map_layers) -> Placement:
    """`solve("sempar", ...)`'s placement of `problem` under `config` (None:
    `SemparConfig.for_problem(problem)`; its undecided shape settings are decided by
    `SemparConfig.for_problem` too). `mapper` (`_pool.map_layers`' signature) runs tp mode's
    per-layer solves."""
    cfg = SemparConfig.for_problem(problem, **asdict(config or SemparConfig()))
    return solve_problem("sempar", problem, lambda p: _solved_for(p, _solve(p, cfg, mapper)))


# preserve groups: slots and swaps stay inside each expert group; mode-aware: tp and dp
# objectives differ; no token ids needed: `--objective auto` solves on fit rows then (rows.py)
@SOLVERS.register("sempar", replicas=True, preserves_groups=True, mode_aware=True)
def sempar(p: PlacementProblem) -> Placement:
    """Ours: locality under a hard per-layer balance cap, mode-aware (module docstring), with
    the default config (`SemparConfig.for_problem`)."""
    return _solved_for(p, _solve(p, SemparConfig.for_problem(p), map_layers))


# ours beside `sempar`: the same solver with a Mt-KaHyPar start beside METIS (hypergraph.py)
@SOLVERS.register("sempar-hypergraph", replicas=True, preserves_groups=True, mode_aware=True)
def sempar_hypergraph(p: PlacementProblem) -> Placement:
    """`sempar` whose tp layers also start from a multilevel hypergraph partition
    (`SemparConfig.hypergraph_start`), the better start kept per layer by fit objective."""
    cfg = SemparConfig.for_problem(p, hypergraph_start=True)
    return _solved_for(p, _solve(p, cfg, map_layers))


def _solved_for(p: PlacementProblem, out: Placement) -> Placement:
    """`out` recording the home rule it was solved for, when one was named, beside its
    objective (info)."""
    if p.homes is not None:
        out.info["homes"] = p.homes
    return out


def _solve(p: PlacementProblem, cfg: SemparConfig, mapper: Callable,
           fit_cap: float | None = None) -> Placement:
    """The unfinished placement (`base.solve_problem` relabels and validates it); cfg decided.
    fit_cap: the balance cap instead of p.max_imbalance (held_out.py's caps below 1.0)."""
    meta = p.trace.meta
    L, N, G = meta.num_layers, meta.num_experts, p.num_devices
    if N % G:
        raise InputError(f"sempar: {N} experts do not split evenly over {G} devices")
    if p.redundant % G:
        raise InputError(f"sempar: --redundant {p.redundant} is not a multiple of the {G} devices "
                         f"(every device takes the same number of replicas)")
    if p.redundant and p.preserve_groups:
        raise InputError("sempar: --preserve-groups with --redundant: replicas have no group slots")
    if resolve_objective(p) == "rows":                 # items: the fit rows (rows.py)
        held_out = HeldOut(target=p.held_out_imbalance, retries=cfg.held_out_retries,
                           replicates=cfg.held_out_replicates,
                           resamples=cfg.held_out_resamples, seed=p.seed,
                           folds=cfg.held_out_folds, refold=cfg.held_out_refold,
                           margin=cfg.held_out_margin, fallback=cfg.held_out_fallback,
                           min_cap=cfg.held_out_min_cap, point_retries=cfg.held_out_point_retries,
                           point_margin=cfg.held_out_point_margin)
        inner = lambda q, fit_cap=None: _solve(q, cfg, mapper, fit_cap)            # noqa: E731
        if p.mode == "tp" and cfg.row_sets:      # layer by layer on distinct sets (row_sets.py)
            fast = replace(cfg, token_patience=cfg.row_patience)
            inner = lambda q, fit_cap=None: _solve(q, fast, mapper, fit_cap)      # noqa: E731
            jobs = usable_cpus() if p.jobs is None else p.jobs
            whole, inner = inner, lambda q, fit_cap=None: solve_by_layer(         # noqa: E731
                q, lambda r: whole(r, fit_cap), mapper, jobs)
        out = solve_rows(p, inner, cfg.budget_rows, held_out, cfg.budget_restarts)
        out.info["objective"] = "rows"
        return out
    stats = AffinityStats(p.trace)
    slot_group, expert_group = slot_groups(p)
    imb = (fit_cap or p.max_imbalance) if not p.redundant else 1 + cfg.replica_slack * (
        p.max_imbalance - 1)                      # the primary's cap (`replica_slack`)
    if p.mode == "dp":
        return _solve_dp(p, stats, slot_group, expert_group, imb, cfg)
    large = bool(cfg.large_trace)
    if large:                     # the large-trace path: scale.py's docstring
        tok_cap = np.full(G, (1 + cfg.token_slack) * stats.a.sum() / G)
        assign = lambda local: capacitated_assign(                                # noqa: E731
            local, stats.a, tok_cap, cfg.scale_token_rounds)

        sparse = bool(cfg.sparse_step)

        def step(C, dev: np.ndarray) -> tuple[np.ndarray, float]:
            if not sparse:
                return dense_step(assign, G)(C, dev)
            sl = sempar_scale.SparseLocal(C, dev, G)
            items = sl.assign(stats.a, tok_cap, cfg.scale_token_rounds)
            return items, sl.total(items)
        sample = sempar_scale.RequestSample(stats.request_index, stats.R, p.seed,
                                            cfg.scale_requests)
    else:
        sample = None
        occ, size = pseudo_batches(stats, p.seed, cfg.shuffles)
        assign = lambda local: batch_priced_assign(                               # noqa: E731
            local, occ, size, cfg.shuffles, cfg.token_price_steps, cfg.token_patience)
        step = dense_step(assign, G)
    layer = _TpLayers(cfg, p, stats, imb, slot_group, expert_group, assign, step, sample)
    jobs = min(L, usable_cpus() if p.jobs is None else p.jobs) if large else 1
    out = mapper(layer, L, jobs, cfg.block_layers)
    devs, toks, objs, hosts_all, rows = (list(x) for x in zip(*out))
    info = {"mode": "tp", "objective": "tokens", "max_imbalance": p.max_imbalance, "fit_local_activations": objs,
            "preserve_groups": p.preserve_groups, "large_trace_path": large}
    if p.redundant:
        return replicated_placement(p, "sempar", np.stack(devs), hosts_all, stats,
                                    np.stack(toks), info)
    return coclustered_placement(p, "sempar", np.stack(devs), stats, np.stack(toks), info,
                                 rows=rows)


@dataclass(frozen=True, eq=False)
class _TpLayers:
    """tp mode's per-layer solve (layers are independent there; `_pool.map_layers` may call it
    in forked workers): the config and the problem's data it reads. assign: local float[U, G]
    -> token device int[U], the token step's capacity rule; step: `alternate`'s token step;
    sample: the large-trace path's `scale.RequestSample`, else None."""

    cfg: SemparConfig
    p: PlacementProblem
    stats: AffinityStats
    imb: float                     # the primary's cap, x the mean load
    slot_group: np.ndarray         # int[G, S]
    expert_group: np.ndarray       # int[N]
    assign: Callable
    step: Callable
    sample: sempar_scale.RequestSample | None

    def __call__(self, l: int):
        """MoE layer l: (expert device int64[N], token device int64[U], fit local activations,
        hosts bool[G, N] or None, token table row (`base.token_table_row`) or None)."""
        cfg, p, stats = self.cfg, self.p, self.stats
        N, G = stats.N, p.num_devices
        C = stats.counts(l)
        if cfg.large_trace:
            X = self.sample.counts(stats.trace.experts[:, l], N)
            load = np.asarray(C.sum(axis=0), np.float64).ravel()
            gram = X.T @ X
            lm = sempar_scale.ScaledLoadModel(
                load, self.sample.scale * load_spread(X, X.sum(axis=0), gram),
                self.imb * load.sum() / G, G, robust=cfg.robust)
            edev = sempar_scale.greedy_start(gram, load, self.slot_group, self.expert_group)
            etok = (sempar_scale.SparseLocal(C, edev, G).first() if cfg.sparse_step  # no cap
                    else np.argmax(np.asarray(C @ onehot(edev, G)), axis=1))
        else:
            lm = layer_load_model(layer_request_counts(stats, l), self.imb, G, cfg.robust)
            edev, etok, _, _ = metis_layer(C.toarray().astype(np.int64), stats.a, G, p.seed)
        search = alternation_settings(cfg, bool(cfg.large_trace or cfg.bounded_experts))
        dev, items, obj = alternate(C, self.step, lm, self.slot_group, self.expert_group, etok,
                                    edev, **search)
        if cfg.hypergraph_start and not cfg.large_trace:      # second start (hypergraph.py)
            hdev = hypergraph_start(C, stats.a, G, self.imb - 1, p.seed, cfg.hypergraph_objective,
                                    cfg.hypergraph_preset)
            htok = np.argmax(np.asarray(C @ onehot(hdev, G)), axis=1)
            other = alternate(C, self.step, lm, self.slot_group, self.expert_group, htok, hdev,
                              **search)
            if other[2] > obj:
                dev, items, obj = other
        if p.redundant:
            h, items = sempar_replicas.tp_replicas(C, dev, items, self.assign, lm,
                                                   p.redundant // G, p.node_of(), cfg)
            return dev, items, obj, h, None        # replicated_placement counts layer l again
        row = token_table_row(stats, l, dev, G, items)
        stats.forget(l)                            # nothing reads layer l's counts after this
        return dev, items, obj, None, row


def _solve_dp(p: PlacementProblem, stats: AffinityStats, slot_group, expert_group, imb: float,
              cfg: SemparConfig) -> Placement:
    """dp mode: requests (one rank for all layers) and every layer's experts, alternated."""
    from sempar.placement.semmoe import initial_requests, request_features

    L, G, R = stats.L, p.num_devices, stats.R
    node_of = p.node_of()
    full = [layer_request_counts(stats, l) for l in range(L)]                     # [R, N] each
    hot = [sempar_replicas.dp_hot(q, G, p.redundant, cfg.dp_hot) for q in full]
    Q = [sempar_replicas.without(q, h) for q, h in zip(full, hot)]   # hot experts: local anywhere
    lms = [layer_load_model(q, imb, G, cfg.robust) for q in Q]
    feats, _ = request_features(np.stack(full), p.seed)
    z = initial_requests(feats, G, p.seed)
    ones = np.ones(R)
    rcap = np.full(G, float(-(-R // G)))
    devs = [None] * L
    best = None
    search = _expert_settings(cfg, bool(cfg.bounded_experts))
    for _ in range(cfg.rounds):
        oz = onehot(z, G)
        for l in range(L):
            W = (Q[l].T @ oz).T.astype(np.float64)
            start = devs[l] if devs[l] is not None and _in_groups(devs[l], slot_group,
                                                                   expert_group) else None
            devs[l] = expert_step(W, lms[l], slot_group, expert_group, start, **search)
        score = sum(Q[l] @ onehot(devs[l], G) for l in range(L)).astype(np.float64)
        z = capacitated_assign(score, ones, rcap)
        obj = float(score[np.arange(R), z].sum())
        if best is not None and obj <= best[2] * (1 + cfg.stop_gain):
            break
        best = ([d.copy() for d in devs], z.copy(), obj)
    devs, z, obj = best
    info = {"mode": "dp", "objective": "tokens", "max_imbalance": p.max_imbalance,
            "fit_local_activations": obj, "preserve_groups": p.preserve_groups}
    clusters = RequestClusters(stats.reqs, z)
    if not p.redundant:
        tdev = None
        if cfg.dp_token_table == "requests":
            votes = np.asarray(stats.request_tokens().T @ onehot(z, G))                # [U, G]
            tdev = np.tile(votes.argmax(axis=1), (L, 1))
        return coclustered_placement(p, "sempar", np.stack(devs), stats, tdev, info=info,
                                     request_cluster=clusters)
    hosts = [sempar_replicas.dp_replicas(full[l], devs[l], z, lms[l], p.redundant // G, node_of,
                                         hot[l], cfg) for l in range(L)]
    return replicated_placement(p, "sempar", np.stack(devs), hosts, stats, None, info,
                                request_cluster=clusters)
