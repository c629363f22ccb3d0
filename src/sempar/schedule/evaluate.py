"""`sempar evaluate`: every placement method in one table, judged on held-out routing.

Protocol (docs/design.md): solve on the fit trace, measure on the eval trace. Homes
(`schedule.homes.method_home`):
- dp mode: a method's own token table when it has one (each new request to the rank its
  tokens prefer, one request per rank per round: Sem-MoE Alg. 2), else requests dealt
  round-robin to the DP ranks in arrival order (equal counts per round);
- tp mode: a method's own token table when it has one (`schedule.homes.home_tp_table`), else
  equal contiguous chunks of every batch of 2,048 tokens (vanilla TP).
Next to each method's LAR stand its oracle LARs: the same placement with homes chosen knowing
the real routing, under the mode's capacity rule (tp: equal tokens per device per batch; dp:
whole requests, each round of G requests matched to the G ranks by maximum local activations)
and unconstrained (every token on its best device). The `oracle` row is the ceiling itself:
solved on the eval trace and placed with the oracle homes (oracle.py), so it is in-sample.
When the fit or the eval trace has no token ids, both are read as having none: the methods
that need them (`base.needs_token_ids`) are listed under `skipped` (refused when named), and
the others run without a token table (vanilla homes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from sempar.errors import InputError
from sempar.placement.base import SOLVERS, PlacementProblem, check_token_ids, solve, solve_problem
from sempar.placement.capacity import ASSIGN_RULES, DEFAULT_ASSIGN, check_slack
from sempar.placement.oracle import ORACLE
from sempar.placement.metrics import placement_figures
from sempar.placement.placement import Placement
from sempar.schedule.homes import method_home, oracle_home, oracle_home_dp
from sempar.solve_options import SolveOptions
from sempar.placement.device_bound import BOUND_EFFORTS, BoundConfig
from sempar.schedule.optimality import optimality_refs
from sempar.trace.ops import without_token_ids
from sempar.trace.schema import RoutingTrace

ATTENTION_MODES = ("dp", "tp")


def figures_for(placement: Placement, eval_: RoutingTrace, mode: str,
                free_lar: float | None = None, chunk_slack: float = 0.0,
                dispatch: str | None = None, home_rule: str = DEFAULT_ASSIGN) -> dict:
    """The per-method figures of the contract for one solved placement in one mode
    (`free_lar`: the unconstrained oracle LAR, when already computed; `chunk_slack`: tp's
    oracle homes may fill a device up to ceil((1 + chunk_slack) x batch / G); `dispatch`: the
    rule choosing among replicas, `placement.dispatch` (None: the placement's own, else
    `nearest`): every figure is after dispatch; `home_rule`: how tp's oracle homes fill the
    equal shares, `capacity.ASSIGN_RULES`: the "optimal" assignment (default) or greedy
    "proposal" rounds)."""
    oracle = (oracle_home_dp(placement, eval_) if mode == "dp"
              else oracle_home(placement, eval_.experts, slack=chunk_slack, rule=home_rule))
    # the ceiling places tokens knowing their routing
    home = oracle if placement.method == ORACLE else method_home(placement, eval_, mode)
    f = placement_figures(placement, eval_.experts, home, dispatch)
    if free_lar is None:
        free_lar = unconstrained_oracle_lar(placement, eval_)
    fo = f if home is oracle else placement_figures(placement, eval_.experts, oracle, dispatch)
    oracle_lar = fo["lar_mean"]
    out = {"lar_mean": f["lar_mean"], "lar_p50": f["lar_p50"],
           "oracle_lar_mean": oracle_lar,
            "oracle_lar_unconstrained_mean": free_lar,
           "node_local_rate": f["node_local_rate"],
           "remote_copies_per_token": f["remote_copies_per_token"],
           "imbalance_max_mean": f["imbalance_max_mean"],
           "imbalance_max_median": f["imbalance_max_median"],
           # with the oracle's homes (differs from the method's only with replicas)
           "oracle_imbalance_max_mean": fo["imbalance_max_mean"],
           # per engine step (lockstep EP pays each step's most loaded device), after dispatch
           "batch_imbalance_max_mean": f["batch_imbalance_max_mean"],
           "oracle_batch_imbalance_max_mean": fo["batch_imbalance_max_mean"],
           "dispatch": f["dispatch"]}
    if mode == "dp":        # the request-level ceiling without balance (whole requests, best rank)
        out["oracle_lar_request_free_mean"] = placement_figures(
            placement, eval_.experts, oracle_home_dp(placement, eval_, balanced=False))["lar_mean"]
    out["share_of_oracle"] = out["lar_mean"] / max(oracle_lar, 1e-12)
    return out


def check_home_rule(rule: str) -> str:
    """`rule` if it names a capacity home rule (`capacity.ASSIGN_RULES`), else InputError."""
    if rule not in ASSIGN_RULES.names():
        raise InputError(f"--home-rule: {rule!r} is not one of {', '.join(ASSIGN_RULES.names())}")
    return rule


@dataclass(frozen=True)
class OracleHomes:
    """How tp's capacity-bound oracle homes fill each batch's shares (`figures_for`):
    `slack` (`--chunk-slack`) lets a device take up to ceil((1 + slack) x batch / G) items,
    `rule` (`--home-rule`, `capacity.ASSIGN_RULES`) is the "optimal" assignment (default) or
    greedy "proposal" rounds."""

    slack: float = 0.0
    rule: str = DEFAULT_ASSIGN

    def check(self) -> "OracleHomes":
        """self, or InputError naming the bad option."""
        check_slack(self.slack, "--chunk-slack")
        check_home_rule(self.rule)
        return self

    def stamp(self) -> dict:
        """The tp entry's keys saying the figures are not today's rule ({} when they are)."""
        return ({"chunk_slack": self.slack} if self.slack else {}) | (
            {"home_rule": self.rule} if self.rule != DEFAULT_ASSIGN else {})


def unconstrained_oracle_lar(placement: Placement, eval_: RoutingTrace) -> float:
    home = oracle_home(placement, eval_.experts, batch=None)
    return placement_figures(placement, eval_.experts, home)["lar_mean"]


def check_evaluation(fit: RoutingTrace, eval_: RoutingTrace, modes: tuple[str, ...],
                     oracle_homes: OracleHomes = OracleHomes()) -> None:
    """The checks that need no model and no placement: `evaluate --online` runs them before it
    loads the model's embedding (a refusal is then the only line on stderr)."""
    oracle_homes.check()
    for mode in modes:
        if mode not in ATTENTION_MODES:
            raise InputError(f"--mode: {mode!r} is not one of {', '.join(ATTENTION_MODES)}")
    if fit.meta.first_difference(eval_.meta) is not None:
        raise InputError("--eval: the eval trace's model shape differs from the fit trace's")


def evaluate_modes(fit: RoutingTrace, eval_: RoutingTrace, ep: int,
                   options: SolveOptions | None = None, *, methods: list[str] | None = None,
                   modes: tuple[str, ...] = ATTENTION_MODES,
                   progress: Callable[[str], None] | None = None,
                   extra: Callable[[Placement, str], dict] | None = None,
                   oracle_homes: OracleHomes = OracleHomes(),
                   placements: dict | None = None,
                   dispatch: str | None = None,
                   bound: BoundConfig | None = BOUND_EFFORTS["fast"]) -> dict[str, dict]:
    """{mode: the `evaluate --json` contract}, every placement solved once for all modes.

    `options` (None: the defaults) go whole to every solver (`base.solve`), each mode's solve
    with its `mode`; `oracle_homes` to the tp oracle homes (`figures_for`), the tp entry saying
    so where they are not the defaults (`OracleHomes.stamp`).
    `extra(placement, mode)` adds keys to each deployable method's entry (`evaluate --online`
    passes the online schedulers' figures; the data flow keeps schedulers downstream of here).
    `placements`: a dict that receives {(method, mode): placement} of every solve, so a caller
    judging the same fit split again (the demo's online stage) reuses them. `dispatch`: the
    rule choosing among replicas (`placement.dispatch`; None: `nearest`), recorded in each
    placement (`info["dispatch"]`) and in each mode's entry. `bound`: the tp bound rows' knobs
    (`device_bound.BOUND_EFFORTS`; None: no bound rows).
    """
    options = options or SolveOptions()
    nodes, redundant = options.num_nodes, options.redundant
    check_evaluation(fit, eval_, modes, oracle_homes)
    if not (fit.meta.has_token_ids and eval_.meta.has_token_ids):
        # one side without ids: a token table fitted on the other would look up zeros
        fit, eval_ = without_token_ids(fit), without_token_ids(eval_)
    names = methods or SOLVERS.names()
    ours = None                                  # sempar's tp placement, for the bound's gap
    solved: dict[tuple[str, str], tuple[Placement, float]] = {}   # (method, mode): (placement, s)
    out = {mode: {"ep": ep, "nodes": nodes, "mode": mode, "redundant": redundant,
                  "fit": {"tokens": fit.num_tokens, "requests": fit.num_requests},
                  "eval": {"tokens": eval_.num_tokens, "requests": eval_.num_requests},
                  "methods": {}} for mode in modes}
    for mode in modes:
        out[mode]["dispatch"] = dispatch or "nearest"
    if "tp" in out:                 # say so only when the figures are not today's rule
        out["tp"].update(oracle_homes.stamp())
    for name in names:
        if progress:
            progress(name)
        spec = SOLVERS.get(name)
        # what the solver does not declare it serves is skipped (`all`) or refused (by name)
        why = {m: spec.refusal(name, fit, redundant=redundant, mode=m,
                               preserve_groups=options.preserve_groups) for m in modes}
        for mode, reason in why.items():
            if reason and methods:
                raise InputError(reason)
            if reason:
                out[mode].setdefault("skipped", {})[name] = reason
        served = tuple(m for m in modes if not why[m])
        # a mode-aware solver (`sempar`) is solved for each mode; the others once for all
        groups = [(m,) for m in served] if spec.mode_aware else [served] if served else []
        for group in groups:
            try:
                check_token_ids(name, group[0], fit, hint=False)
            except InputError as err:
                if methods:
                    raise
                for mode in group:                  # `all` without token ids: say who cannot
                    out[mode].setdefault("skipped", {})[name] = str(err)
                continue
            t0 = time.perf_counter()
            opts = replace(options, mode=group[0])
            # a solver that extends another gets that one's placement of the same problem, not a
            # second solve (one node only: a multi-node solve relabels devices afterwards)
            base = solved.get((spec.extends, group[0])) if spec.extends and nodes == 1 else None
            if base is not None:
                placement = solve_problem(name, PlacementProblem.of(fit, ep, opts),
                                          lambda p, b=base[0]: spec.fn(p, base=b))
            else:   # the ceiling is solved on the data it is judged on (oracle.py); the rest on fit
                placement = solve(name, eval_ if name == ORACLE else fit, num_devices=ep,
                                  options=opts)
            # the time it takes alone: the extended method's solve counted in
            seconds = round(time.perf_counter() - t0 + (base[1] if base else 0.0), 4)
            if dispatch is not None:
                placement.info["dispatch"] = dispatch
            free = unconstrained_oracle_lar(placement, eval_)
            for mode in group:
                solved[(name, mode)] = (placement, seconds)
                out[mode]["methods"][name] = dict(
                    figures_for(placement, eval_, mode, free, oracle_homes.slack, dispatch,
                                oracle_homes.rule),
                    solve_seconds=seconds,
                    **held_out_entry(placement))
                if extra is not None and name != ORACLE:
                    out[mode]["methods"][name].update(extra(placement, mode))
                if name == "sempar" and mode == "tp" and not redundant:
                    ours = placement                       # the bound's in-sample figure
    if placements is not None:
        placements.update((key, placement) for key, (placement, _) in solved.items())
    for mode in modes:
        out[mode]["refs"] = ceiling_refs(out[mode]["methods"], mode)
    if "tp" in out and out["tp"]["methods"] and not redundant and bound is not None:
        out["tp"]["refs"].update(                # how far from optimal (schedule/optimality.py)
            optimality_refs(fit, ep, ours, options.max_imbalance, bound))
    return out


def held_out_entry(placement: Placement) -> dict:
    """{"held_out": ...}: the solver's held-out imbalance prediction (placement/sempar/
    held_out.py: predicted imbalance, the cap solved at, `within_budget`, a `warning` where the
    fit is too small to promise the budget), or {} for a placement without one."""
    h = placement.info.get("held_out")
    return {"held_out": dict(h)} if isinstance(h, dict) else {}


def held_out_warnings(result: dict) -> list[str]:
    """One line per method of an `evaluate` result whose fit cannot promise its held-out
    imbalance budget (`held_out.within_budget` false)."""
    return [f"warning: {name}: {r['held_out'].get('warning', 'not within budget')}"
            for name, r in result.get("methods", {}).items()
            if "held_out" in r and not r["held_out"].get("within_budget", True)]


def ceiling_refs(methods: dict, mode: str) -> dict:
    """The `ref:` rows: the highest ceiling any placement reached (its capacity-bound oracle,
    the unconstrained one, and in dp mode each request on its best rank with and without the
    per-round balance), so each method's LAR reads as a share of what is reachable."""
    if not methods:
        return {}
    keys = [("ref: capacity-bound oracle", "oracle_lar_mean"),
            ("ref: every token on its best device", "oracle_lar_unconstrained_mean")]
    if mode == "dp":
        keys[0] = ("ref: requests on best rank, balanced", "oracle_lar_mean")
        keys.insert(1, ("ref: requests on best rank, free", "oracle_lar_request_free_mean"))
    refs = {}
    for label, key in keys:
        best = max(methods, key=lambda m: methods[m].get(key, -1.0))
        refs[label] = {"lar_mean": methods[best][key], "placement": best}
    return refs


def evaluate(fit: RoutingTrace, eval_: RoutingTrace, ep: int,
             options: SolveOptions | None = None, *, methods: list[str] | None = None,
             progress: Callable[[str], None] | None = None,
             extra: Callable[[Placement, str], dict] | None = None,
             oracle_homes: OracleHomes = OracleHomes(), dispatch: str | None = None,
             bound: BoundConfig | None = BOUND_EFFORTS["fast"]) -> dict:
    """The `evaluate --json` contract for `methods` (default: every registered one) in
    `options.mode`, replicas served by `dispatch` (None: `nearest`), the tp bound rows by
    `bound` (`evaluate_modes`)."""
    options = options or SolveOptions()
    return evaluate_modes(fit, eval_, ep, options, methods=methods, modes=(options.mode,),
                          progress=progress, extra=extra, oracle_homes=oracle_homes,
                          dispatch=dispatch, bound=bound)[options.mode]


def evaluate_fitted(placement: Placement, eval_: RoutingTrace, ep: int, options: SolveOptions,
                    fit: dict, *, fit_token_ids: bool = True, seconds: float | None = None,
                    oracle_homes: OracleHomes = OracleHomes()) -> dict:
    """The `evaluate --json` contract (one mode, `options.mode`) for one placement fitted
    elsewhere: `evaluate --fit-stats`, the `sempar` placement solved from `RoutingStats`
    (placement/from_stats.py). The figures are `figures_for`'s, as `evaluate_modes` gives them
    for the placement fitted on the trace the stats summarise (the same placement: equal
    figures, tested); `fit` describes the fit data ({"tokens", "requests", ...}). The
    optimality references (`schedule/optimality.py`) read the fit trace's rows and are left
    out. When the fit data (`fit_token_ids`) or the eval trace has no token ids, both are read
    as having none, as `evaluate_modes` does: the placement's token table is dropped."""
    mode = options.mode
    oracle_homes.check()
    if mode not in ATTENTION_MODES:
        raise InputError(f"--mode: {mode!r} is not one of {', '.join(ATTENTION_MODES)}")
    if not (fit_token_ids and eval_.meta.has_token_ids):
        placement.token_table = None
        eval_ = without_token_ids(eval_)
    out = {"ep": ep, "nodes": options.num_nodes, "mode": mode, "redundant": options.redundant,
           "fit": dict(fit), "eval": {"tokens": eval_.num_tokens, "requests": eval_.num_requests},
           "methods": {}}
    if mode == "tp":
        out.update(oracle_homes.stamp())
    figs = figures_for(placement, eval_, mode, None, oracle_homes.slack,
                       home_rule=oracle_homes.rule)
    if seconds is not None:
        figs["solve_seconds"] = seconds
    figs.update(held_out_entry(placement))
    out["methods"][placement.method] = figs
    out["refs"] = ceiling_refs(out["methods"], mode)
    return out
