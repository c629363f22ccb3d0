"""`sempar evaluate`: placement methods compared on held-out routing (LAR, oracle LAR, copies,
imbalance), optionally with the online schedulers and the cross-dataset matrix."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import CHUNK_SLACK, bound
from sempar.commands._names import dispatch_option, names_option, request_policies, solvers
from sempar.commands._options import (ep_option, held_out_option, homes_option, json_option,
                                      max_imbalance_option, mode_option, nodes_option,
                                      objective_option, preserve_groups_option, redundant_option,
                                      seed_option, solve_options)
from sempar.console import emit_json, out
from sempar.errors import InputError

# `placement.capacity.DEFAULT_ASSIGN`, spelled here so that building the CLI imports no solver
# (tests/schedule/test_home_rule_option.py holds the two equal)
HOME_RULE = "optimal"


def evaluate(ctx: typer.Context,
             fit: Optional[Path] = typer.Option(None, "--fit",
                                                help="trace the placements are solved on"),
             fit_stats: Optional[Path] = typer.Option(
                 None, "--fit-stats", help="fit statistics (`sempar stats build`) instead of "
                 "--fit: the sempar placement solved from them (as `place --stats`) is "
                 "evaluated on --eval"),
             eval_file: Optional[Path] = typer.Option(None, "--eval", help="held-out trace"),
             ep: int = ep_option(..., "EP degree G"),
             nodes: int = nodes_option(1),
             methods: str = names_option("all", "--methods", solvers, words=("all",),
                                         help="comma-separated, or all"),
             mode: str = mode_option("dp or tp"),
             redundant: int = redundant_option(),
             max_imbalance: float = max_imbalance_option(),
             preserve_groups: bool = preserve_groups_option(),
             split: bool = typer.Option(False, "--split", help="split --fit 20/80 by request"),
             homes: str = homes_option(),
          objective: str = objective_option(),
             held_out_imbalance: float = held_out_option(),
             cross: bool = typer.Option(False, "--cross-dataset",
                                        help="also fit on each domain of --fit, evaluate on the others"),
             online: bool = typer.Option(False, "--online",
                                         help="also place eval tokens with the online schedulers"),
             policy: str = names_option("alg2", "--policy", request_policies, single=True,
                                        help="dp request policy for --online"),
             lookback: int = typer.Option(2, "--lookback", help="n-gram look-back for --online",
                                     callback=bound(0, 64)),
             chunk_slack: float = typer.Option(0.0, "--chunk-slack", callback=CHUNK_SLACK,
                                               help="tp oracle / pre-routed homes: a device may "
                                               "take up to (1 + EPS) x batch / G, in [0, 1)"),
             dispatch: str = dispatch_option(),
             home_rule: str = typer.Option(
                 HOME_RULE, "--home-rule", help="how tp's oracle homes (exact-home LAR, "
                 "and --online's exact pre-routed figures) fill each batch's equal shares: "
                 "optimal (the most local activations within the shares, the default) or "
                 "proposal (greedy rounds); --online's schedulers keep their own rules"),
             bound_effort: str = typer.Option(
                 "fast", "--bound", help="tp's bound row (how far from optimal, on the fit "
                 "sample): fast (listed device-set LP / pair budget), full (also the column "
                 "generation where the sets cannot be listed, and the row-pair Lagrangian "
                 "bound where they cannot be scanned: minutes a case) or none"),
             seed: int = seed_option(),
             as_json: bool = json_option()) -> None:
    """Compare placement methods on held-out routing: LAR, oracle LAR, remote copies, imbalance."""
    from sempar.placement import SOLVERS
    from sempar.schedule.evaluate import evaluate as run
    from sempar.schedule.transfer import DEFAULT_METHODS, cross_dataset_matrix
    from sempar.progress import steps
    from sempar.report.console import print_cross, print_evaluation
    from sempar.trace import read_trace, split_by_request

    from sempar.placement.device_bound import BOUND_EFFORTS

    if bound_effort not in BOUND_EFFORTS:
        raise InputError(f"--bound: {bound_effort!r} is not one of {', '.join(BOUND_EFFORTS)}")
    from sempar.schedule.evaluate import check_home_rule

    check_home_rule(home_rule)            # before any trace or statistics is read
    options = solve_options(ctx)          # passed whole to every solve, the matrix's too
    if (fit is None) == (fit_stats is None):
        raise InputError("evaluate: give one of --fit or --fit-stats")
    if fit_stats is not None:
        _evaluate_stats(fit_stats, eval_file, ep, methods, options, split, cross, online,
                        chunk_slack, as_json, home_rule)
        return
    if split == (eval_file is not None):
        raise InputError("evaluate: give --eval EVAL, or --split to divide --fit 20/80 by request")
    names = SOLVERS.names() if methods == "all" else [m.strip() for m in methods.split(",")]
    for n in names:
        SOLVERS.get(n)
    whole = read_trace(fit, optional=("domain",))   # no solver reads router weights
    if split:
        fit_trace, eval_trace = split_by_request(whole, seed=seed)
    else:
        fit_trace, eval_trace = whole, read_trace(eval_file, optional=("domain",))
    extra = home = None
    from sempar.schedule.evaluate import OracleHomes, check_evaluation

    homes_rule = OracleHomes(chunk_slack, home_rule)
    check_evaluation(fit_trace, eval_trace, (mode,), homes_rule)   # before loads
    if online:
        from sempar.trace.schema import require_token_ids

        from sempar.schedule.agreement import check_vocabulary

        for t in (fit_trace, eval_trace):       # before any placement work
            require_token_ids(t.meta, "--online")
            check_vocabulary(t)
        from sempar.schedule.online import OnlineHomes, model_embedding, online_figures
        from sempar.schedule.requests import REQUEST_POLICIES

        REQUEST_POLICIES.get(policy)
        if lookback < 0:
            raise InputError(f"--lookback: {lookback} is negative")
        oov = model_embedding(fit_trace.meta.model)
        extra = lambda p, m: online_figures(p, fit_trace, eval_trace, m, oov,  # noqa: E731
                                            lookback, policy, chunk_slack)
        home = OnlineHomes(oov, lookback, policy)
    cross_names = [n for n in (DEFAULT_METHODS if methods == "all" else names) if n != "oracle"]
    chosen = names if methods != "all" else None
    with steps("evaluate", len(names)) as step:
        result = run(fit_trace, eval_trace, ep, options, methods=chosen, progress=step,
                     extra=extra, oracle_homes=homes_rule, dispatch=dispatch,
                     bound=BOUND_EFFORTS[bound_effort])
    if cross:
        with steps("cross-dataset", len(cross_names) * len(whole.domains)) as step:
            # `all` lists the methods that refuse these options under `skipped`
            result["cross_dataset"] = cross_dataset_matrix(
                whole, ep, options, methods=cross_names, skip_refused=methods == "all",
                progress=step, home=home)
    _warn(result)
    if as_json:
        emit_json(result)
        return
    print_evaluation(out, result)
    if cross:
        print_cross(out, result["cross_dataset"])


def _evaluate_stats(stats_file: Path, eval_file: Optional[Path], ep: int, methods: str,
                    options, split: bool, cross: bool, online: bool, chunk_slack: float,
                    as_json: bool, home_rule: str = HOME_RULE) -> None:
    """`evaluate --fit-stats`: the sempar placement solved from statistics
    (placement/from_stats.py), judged on --eval (`schedule.evaluate.evaluate_fitted`)."""
    import time

    from sempar.stats.file import load_stats
    from sempar.placement.from_stats import check_stats_solve, solve_from_stats
    from sempar.report.console import print_evaluation
    from sempar.schedule.evaluate import OracleHomes, evaluate_fitted
    from sempar.trace import read_trace

    for flag, given in (("--split", split), ("--cross-dataset", cross), ("--online", online)):
        if given:
            raise InputError(f"{flag}: reads the fit trace's rows; not with --fit-stats")
    if eval_file is None:
        raise InputError("evaluate --fit-stats: give --eval EVAL")
    names = ["sempar"] if methods == "all" else [m.strip() for m in methods.split(",")]
    stats = load_stats(stats_file)
    for name in names:
        check_stats_solve(stats, name, options)
    eval_trace = read_trace(eval_file, optional=("domain",))
    if stats.meta.first_difference(eval_trace.meta) is not None:
        raise InputError("--eval: the eval trace's model shape differs from the fit stats'")
    t0 = time.perf_counter()
    placement = solve_from_stats(stats, num_devices=ep, options=options)
    seconds = round(time.perf_counter() - t0, 4)
    fit = {"tokens": stats.rows, "requests": int(stats.request_ids.size),
           "stats": str(stats_file), "shards": len(stats.shards)}
    result = evaluate_fitted(placement, eval_trace, ep, options, fit, seconds=seconds,
                             fit_token_ids=stats.meta.has_token_ids,
                             oracle_homes=OracleHomes(chunk_slack, home_rule))
    _warn(result)
    if as_json:
        emit_json(result)
        return
    print_evaluation(out, result)


def _warn(result: dict) -> None:
    """The held-out budget warnings (`schedule.evaluate.held_out_warnings`) on stderr, before the
    table or the JSON (whose `held_out` entries carry them too)."""
    from sempar.schedule.evaluate import held_out_warnings

    for line in held_out_warnings(result):
        sys.stderr.write(line + "\n")


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
