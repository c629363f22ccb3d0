"""`sempar-exact`: `sempar` with an exact start where a layer's device sets can be listed.

Ours, beside `sempar` (placement/sempar/solver.py), not a paper's algorithm. In tp mode with the
`rows` objective (homes from exact pre-routing) and no replicas or groups, at each MoE layer
whose C(N, N / G) device sets can be listed (`config_ilp.listable`: GPT-OSS-20B at EP 8):

1. solve the integer device-configuration program (`config_ilp.integer_config`: our
   Dantzig-Wolfe / set-partitioning formulation; choose G disjoint device sets, each expert in
   one, maximising sum_d V(D_d), V the most local activations a set can count alone) with HiGHS
   under `ExactConfig.ilp`'s time limit, over the sets within the layer's balance cap that
   also meet sempar's own load model at its fit cap (`LoadModel`: the fit load plus the robust
   margin for the spread a grouping adds, `robust_set_loads`), as sempar's expert step does;
2. refine its partition with sempar's own moves (`solver.alternate`: the capacitated token step
   and the expert step of Hungarian assignment plus load-capped pairwise swaps) on the layer's
   fit rows aggregated by expert set (`row_sets.layer_trace`), at sempar's fit cap;
3. keep, per layer, the best by the real figure (capacity-bound exact-home LAR on the fit trace,
   `capacity.capacity_home`: rows homed together, equal shares per tp batch) of sempar's own
   placement, the MILP's partition and its refinement, among those whose load imbalance on the
   fit trace is at most the layer's cap (the larger of sempar's fit cap and sempar's own
   imbalance there) and whose devices all meet sempar's load model at its fit cap. (A first
   version held the candidates to the first rule alone: on a 20 % fit of GPT-OSS-20B at EP 8
   its held-out imbalance went to 1.149 against `sempar`'s 1.087.)

So it is never worse than `sempar` on the fit figure, under sempar's own balance rule.

`sempar-exact-refine` (ours, beside it; `ExactConfig.homes`): the same candidates kept by the
optimal-home figure (`capacity.ASSIGN_RULES["optimal"]`), then per layer a last pass of expert
swaps scored on that figure (placement/refine.py), a swap admitted where the layer's imbalance
stays within its cap and both devices it changes stay within sempar's load model at the larger
of its fit cap and the kept partition's own worst device. It runs at every EP where the pass's
key table fits (the MILP left out where its sets cannot be listed: GPT-OSS-20B at EP 4,
`info["exact"]["milp"]` says so), and is never below `sempar-exact`'s kept partition on the
optimal-home figure. It serves
tp mode only (its program is tp's figure; declared, so `evaluate` does not solve `sempar` a
second time under its name in dp mode), and declares that it extends `sempar`: `evaluate` hands
it the `sempar` placement it already solved for the same problem instead of a second solve. Elsewhere (the tokens objective, replicas, groups, sets
too many to list) it is `sempar` (`info["exact"]["fallback"]` says why). `info["exact"]["layers"]` reports per layer the
source kept, the figures and the MILP's own gap (its dual bound is also an upper bound on the
sum_d V(D_d) of every placement within the cap, so on the real figure too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from sempar.affinity.affinity_stats import AffinityStats
from sempar.placement.base import SOLVERS, PlacementProblem, slot_groups, token_table_row
from sempar.placement.capacity import BATCH, SEARCH_ASSIGN
from sempar.placement.config_ilp import (ConfigIlpConfig, expert_devices, imbalance,
                                         integer_config, layer_local, listable)
from sempar.placement.placement import Placement
from sempar.placement.refine import LayerHomes, RefineConfig, fits, refine_layer
from sempar.placement.sempar.config import SemparConfig
from sempar.placement.sempar.held_out import derived_held_out
from sempar.placement.sempar.load import layer_load_model, layer_request_counts, onehot
from sempar.placement.sempar.row_sets import layer_trace
from sempar.placement.sempar.rows import first_copy_device, resolve_objective, row_trace
from sempar.placement.sempar.solver import alternate, alternation_settings, dense_step, sempar
from sempar.placement.sempar.tokens import batch_priced_assign, pseudo_batches
from sempar.predict.token_table import TokenTable


@dataclass(frozen=True)
class ExactConfig:
    """Knobs of `sempar-exact`.

    ilp: the integer configuration program's (per-layer HiGHS time limit `ilp.time_limit_s`;
        stopped there the incumbent partition is used and its gap reported);
    refine: refine the MILP's partition with sempar's moves (step 2);
    batch: the tp batch of the real figure's equal shares (docs/design.md's 2,048);
    homes: None, or the swap pass scored on the optimal-home figure run last on each layer's
        kept partition (`refine.refine_layer`; `sempar-exact-refine`), also where the device
        sets cannot be listed (the MILP then left out); the candidates of step 3 are then kept
        by the optimal homes' figure too (the layer record's `lar_*` are that figure's)."""

    ilp: ConfigIlpConfig = ConfigIlpConfig(time_limit_s=30.0)
    refine: bool = True
    batch: int = BATCH
    homes: RefineConfig | None = None

    def judged_by(self) -> str:
        """The capacity home rule the candidates of step 3 are judged by: the solvers' search
        rule (`capacity.SEARCH_ASSIGN`, the greedy rounds) without the swap pass; with it, the
        optimal homes' (the figure the pass itself scores)."""
        return SEARCH_ASSIGN if self.homes is None else "optimal"


def layer_model(rows: PlacementProblem, l: int, cap: float, cfg: SemparConfig):
    """(one-layer trace of layer l of the row trace rows.trace by expert set
    (`row_sets.layer_trace`), its `AffinityStats`, sempar's `LoadModel` there at cap x the mean:
    the fit load plus the robust margin for the spread a grouping adds)."""
    lt = layer_trace(rows.trace, l)
    stats = AffinityStats(lt)
    return lt, stats, layer_load_model(layer_request_counts(stats, 0), cap, rows.num_devices, cfg.robust)


def robust_set_loads(lm, sets: np.ndarray) -> np.ndarray:
    """float64[n]: `LoadModel.of`'s device load for each expert set sets int[n, S] (the fit
    load plus the margin sqrt(1_D^T sigma 1_D) less the uniform offset)."""
    L = lm.load[sets].sum(axis=1)
    if lm.sigma is None:
        return L
    V = lm.sigma[sets[:, :, None], sets[:, None, :]].sum(axis=(1, 2))
    return L + np.sqrt(np.maximum(V, 0.0)) - lm.offset


def sempar_moves(rows: PlacementProblem, model: tuple, start: np.ndarray,
                 cfg: SemparConfig) -> np.ndarray:
    """int64[N]: device of each expert after sempar's alternation (`solver.alternate`, the
    `rows` objective's layer solve: items the distinct expert sets of one layer of the row
    trace) from the expert devices start int[N]; model: `layer_model`'s answer."""
    G = rows.num_devices
    lt, stats, lm = model
    C = stats.counts(0)
    occ, size = pseudo_batches(stats, rows.seed, cfg.shuffles)
    step = dense_step(lambda local: batch_priced_assign(
        local, occ, size, cfg.shuffles, cfg.token_price_steps, cfg.row_patience), G)
    sg, eg = slot_groups(dataclasses.replace(rows, trace=lt))
    items = np.argmax(np.asarray(C @ onehot(start, G)), axis=1)
    dev, _, _ = alternate(C, step, lm, sg, eg, items, start, **alternation_settings(cfg, False))
    return np.asarray(dev, np.int64)


def _unlisted(N: int, G: int, ilp: ConfigIlpConfig) -> str:
    """Why the integer program cannot run: its device sets cannot be listed."""
    return f"C({N}, {N // G}) device sets exceed {ilp.max_device_sets}"


def _steps(p: PlacementProblem, config: ExactConfig) -> tuple[bool, bool]:
    """(the integer program runs: its device sets can be listed, the swap pass runs: a swap
    pass is asked for and its key table fits), for `p`'s N experts, G devices and top-k."""
    N, G = p.trace.meta.num_experts, p.num_devices
    swap = config.homes is not None and fits(N, G, p.trace.experts.shape[2], config.homes)
    return listable(N, G, config.ilp), swap


def _why_not(p: PlacementProblem, config: ExactConfig) -> str | None:
    """Why the exact start does not apply to `p` (None: it does)."""
    if p.redundant or p.preserve_groups:
        return "replicas or preserved groups"
    if resolve_objective(p) != "rows":
        return "tokens objective"
    milp, swap = _steps(p, config)
    if not (milp or swap):                   # the swap pass runs without the MILP
        return _unlisted(p.trace.meta.num_experts, p.num_devices, config.ilp)
    return None


def exact_solve(p: PlacementProblem, config: ExactConfig = ExactConfig(),
                base: Placement | None = None) -> Placement:
    """`sempar-exact`'s unfinished placement of `p` (module docstring; `base.solve_problem`
    relabels and validates it); base: `sempar`'s placement of the same `p` (None: solved here)."""
    base = sempar(p) if base is None else base
    why = _why_not(p, config)
    if why is not None:
        base.info["exact"] = {"fallback": why}
        return base
    N, G, L = p.trace.meta.num_experts, p.num_devices, p.trace.meta.num_layers
    cfg = SemparConfig.for_problem(p)
    fit_cap = float(base.info.get("held_out", {}).get("fit_cap", p.max_imbalance))
    rows = dataclasses.replace(p, trace=row_trace(p.trace, cfg.budget_rows, p.seed),
                               objective="tokens", redundant=0)
    phy2log = np.array(base.phy2log, np.int64)
    milp, swap = _steps(p, config)
    layers = []
    with threadpool_limits(1):             # small dense steps and one-core HiGHS: no contention
        for l in range(L):
            ex = np.asarray(p.trace.experts[:, l], np.int64)
            count = np.bincount(ex.ravel(), minlength=N).astype(np.float64)
            own = expert_devices(phy2log[l], G)
            cap = max(fit_cap, imbalance(own, count, G))
            model = layer_model(rows, l, fit_cap, cfg)
            lm = model[2]

            def admit(sets: np.ndarray) -> np.ndarray:       # sempar's own cap, margin included
                return robust_set_loads(lm, sets) <= lm.cap * (1 + 1e-9)

            cands = {"sempar": own}
            ilp = integer_config(ex, N, G, config.ilp, cap, starts=(phy2log[l],), admit=admit) \
                if milp else None
            if ilp is not None and ilp["partition"] is not None:
                cands["milp"] = expert_devices(ilp["partition"], G)
                if config.refine:
                    cands["milp+sempar moves"] = sempar_moves(rows, model, cands["milp"], cfg)
            fig = {k: layer_local(d, ex, G, config.batch, config.judged_by())
                   for k, d in cands.items()}
            ok = [k for k, d in cands.items() if k == "sempar" or (
                imbalance(d, count, G) <= cap * (1 + 1e-12)
                and admit(np.sort(np.argsort(d, kind="stable").reshape(G, -1), axis=1)).all())]
            keep = max(ok, key=lambda k: (fig[k], k == "sempar"))
            dev = cands[keep]
            homes = None
            if swap:
                dev, homes = _homes_pass(ex, N, G, dev, count, cap, lm, admit, config, p.seed)
            phy2log[l] = np.argsort(dev * N + np.arange(N), kind="stable")    # device order
            layers.append({"kept": keep, "cap": round(cap, 4),
                           "robust_load": round(float(lm.of(dev, G).max() / (lm.load.sum() / G)),
                                                4), "fit_cap": round(fit_cap, 4),
                           **{f"lar_{k}": round(v / max(ex.size, 1), 5) for k, v in fig.items()},
                           **({} if ilp is None else {
                               "milp_gap": round(ilp["gap"], 6), "milp_optimal": ilp["optimal"],
                               "milp_bound": round(ilp["local"] / max(ex.size, 1), 5),
                               "milp_s": round(ilp["seconds"], 1)}),
                           **({} if homes is None else {"homes": homes})})
    name = "sempar-exact" if config.homes is None else "sempar-exact-refine"
    out = Placement(phy2log, N, G, p.node_of(), name, info=dict(base.info))
    out.info["exact"] = {"layers": layers, "ilp_time_limit_s": config.ilp.time_limit_s}
    if isinstance(base.info.get("held_out"), dict):     # sempar's prediction is not this one's
        out.info["held_out"] = derived_held_out(out, rows.trace, base.info["held_out"],
                                                cfg.held_out(p))
    if not milp:
        out.info["exact"]["milp"] = f"{_unlisted(N, G, config.ilp)}: left out"
    if p.trace.meta.has_token_ids:             # the real ids' table for the new experts
        stats = AffinityStats(p.trace)
        dev = first_copy_device(out)
        table = [token_table_row(stats, l, dev[l], G) for l in range(L)]
        out.token_table = TokenTable(stats.tokens, np.stack([t[0] for t in table]),
                                     np.stack([t[1] for t in table]))
    return out


# every request `sempar` serves (the others fall back to it); ours, beside `sempar`
@SOLVERS.register("sempar-exact", replicas=True, preserves_groups=True, mode_aware=True,
                  modes=("tp",), extends="sempar")
def sempar_exact(p: PlacementProblem, base: Placement | None = None) -> Placement:
    """`sempar` with the integer configuration program's partition as a start, refined with
    sempar's moves and kept per layer where its real figure is higher (module docstring);
    base: `sempar`'s finished placement of the same problem, if already solved."""
    return exact_solve(p, ExactConfig(), base)


def _homes_pass(ex: np.ndarray, N: int, G: int, dev: np.ndarray, count: np.ndarray, cap: float,
                lm, admit, config: ExactConfig, seed: int) -> tuple[np.ndarray, dict]:
    """(dev int64[N] after the swap pass on the optimal-home figure, its record) from the kept
    partition dev int[N] of one layer ex int[T, k]: a swap is admitted where the load imbalance
    stays within the layer's cap and both changed devices stay within sempar's load model at
    the larger of its fit cap and the partition's own worst device (so neither the fit
    imbalance nor sempar's robust load of the worst device rises)."""
    start_robust = float(lm.of(dev, G).max())
    limit = max(lm.cap, start_robust) * (1 + 1e-9)

    def ok(new: np.ndarray, g: int, h: int) -> bool:
        if imbalance(new, count, G) > cap * (1 + 1e-12):
            return False
        sets = np.stack([np.flatnonzero(new == g), np.flatnonzero(new == h)])
        return bool((robust_set_loads(lm, sets) <= limit).all())

    layer = LayerHomes(ex, N, G, config.batch)
    new, rec = refine_layer(layer, dev, ok, config.homes, seed)
    rec = {"lar_optimal_before": round(rec["before"] / max(ex.size, 1), 5),
           "lar_optimal_after": round(rec["after"] / max(ex.size, 1), 5),
           "lar_after": round(layer_local(new, ex, G, config.batch) / max(ex.size, 1), 5),
           "robust_load_after": round(float(lm.of(new, G).max() / (lm.load.sum() / G)), 4),
           **{k: rec[k] for k in ("swaps", "tries", "scans", "seconds")}}
    return new, rec


# ours, beside `sempar-exact`: its placement with the swap pass on the optimal-home figure last
@SOLVERS.register("sempar-exact-refine", replicas=True, preserves_groups=True, mode_aware=True,
                  modes=("tp",), extends="sempar")
def sempar_exact_refine(p: PlacementProblem, base: Placement | None = None) -> Placement:
    """`sempar-exact` with a last pass of expert swaps per layer scored on the capacity-bound
    exact-home LAR with the optimal home assignment (placement/refine.py), within the layer's
    cap and sempar's load model; it runs also where the MILP's device sets cannot be listed."""
    return exact_solve(p, ExactConfig(homes=RefineConfig()), base)
