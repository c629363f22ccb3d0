"""`sempar replay`: serve a drift stream under re-placement policies, step by step, side by side."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import REQUESTS_MAX, bound
from sempar.commands._names import names_option
from sempar.commands._options import ep_option, json_option, seed_option
from sempar.commands.rebalance import cost_option, imbalance_option, moves_option
from sempar.drift.costs import MOVES_MAX


def _policies():
    from sempar.drift.policies import POLICIES

    return POLICIES


def _dispatch_rules():
    from sempar.placement.dispatch import DISPATCH

    return DISPATCH


def _engines():
    from sempar.drift.engines import CADENCES

    return CADENCES


def replay(trace: Path = typer.Option(..., "--trace", help="stream trace: requests in arrival "
                                                          "order (`sempar drift` makes one)"),
           ep: int = ep_option(..., "EP degree G (devices)"),
           policies: str = names_option("static,resolve,eplb-periodic,sempar-incremental",
                                        "--policies", _policies, help="policies to compare"),
           every: Optional[int] = typer.Option(None, "--every", callback=bound(1, REQUESTS_MAX),
                                               help="requests served per step (policies "
                                                    "update between; default 16)"),
           window: Optional[int] = typer.Option(None, "--window", callback=bound(1, REQUESTS_MAX),
                                                help="requests an update sees (the last served; "
                                                     "default 32)"),
           max_steps: Optional[int] = typer.Option(None, "--max-steps",
                                                   callback=bound(1, REQUESTS_MAX),
                                                   help="stop after this many steps"),
           redundant: int = typer.Option(0, "--redundant", callback=bound(0, MOVES_MAX),
                                         help="replica slots per layer every policy gets (R)"),
           dispatch: Optional[str] = names_option(None, "--dispatch", _dispatch_rules, single=True,
                                                  help="which copy of a replicated expert serves "
                                                       "a token (default: nearest)"),
           engine: Optional[str] = names_option(None, "--engine", _engines, single=True,
                                                help="sempar-engine: the balancer it runs in, "
                                                     "at its cadence (default vllm)"),
           max_moves: Optional[int] = moves_option("sempar-incremental: moves per update "
                                                   "(default 64)"),
           max_imbalance: Optional[float] = imbalance_option(
               "the solves' fit cap and sempar-incremental's window bound (default 1.05, "
               "`place`'s, for 1.10 on new requests)"),
           history: Optional[int] = typer.Option(None, "--history", callback=bound(0, 64),
                                                 help="sempar-incremental: windows of load history "
                                                      "beyond --window its bound also holds on "
                                                      "(default 3)"),
           horizon: Optional[float] = cost_option("horizon", "sempar-incremental: "),
           tokens_per_s: Optional[float] = cost_option("tokens_per_s"),
           expert_bytes: Optional[float] = cost_option("expert_bytes"),
           seed: int = seed_option(),
           jobs: Optional[int] = typer.Option(None, "--jobs", callback=bound(1, 4096),
                                              help="worker processes of the sempar solves "
                                                   "(default 1)"),
           plot: Optional[Path] = typer.Option(None, "--plot", help="folder for the time-series PNG"),
           placements: Optional[Path] = typer.Option(
               None, "--placements", help="folder for every step's placement.json per policy "
                                          "(`sempar export` turns one into an engine's file)"),
           as_json: bool = json_option()) -> None:
    """Replay a stream: every --every requests each policy may update its placement from the
    last --window requests; per step exact-home LAR, imbalance, migrated bytes, solve time."""
    from contextlib import ExitStack

    from sempar.atomic import atomic_folder, check_folder_output
    from sempar.console import emit_json
    from sempar.drift.config import ReplayConfig
    from sempar.drift.history import History
    from sempar.solve_options import SolveOptions
    from sempar.drift.replay import replay as run
    from sempar.trace import read_trace

    from sempar.output_rule import check_distinct_outputs

    check_distinct_outputs(("--plot", plot), ("--placements", placements))
    for option, folder in (("--plot", plot), ("--placements", placements)):
        if folder is not None:
            check_folder_output(folder, trace, option=option)
    stream = read_trace(trace, optional=("domain",))
    names = [n.strip() for n in policies.split(",") if n.strip()]
    solve = SolveOptions(**{k: v for k, v in dict(seed=seed, jobs=jobs, redundant=redundant,
                                                   max_imbalance=max_imbalance).items()
                            if v is not None})
    cfg = ReplayConfig.for_model(
        stream.meta.model, ep, solve=solve,
        rebalance=dict(max_moves=max_moves, max_imbalance=max_imbalance, horizon_s=horizon,
                       tokens_per_s=tokens_per_s, expert_bytes=expert_bytes),
        every=every, window=window, max_steps=max_steps, dispatch=dispatch, engine=engine,
        history=History(windows=history) if history is not None else None)
    with ExitStack() as stack:
        pdir = (stack.enter_context(atomic_folder(placements, "replay placements", trace,
                                                option="--placements"))
                if placements is not None else None)

        def on_step(name, fig, p) -> None:
            sys.stderr.write(f"{name} step {fig.step}: LAR {fig.lar:.4f} imbalance "
                             f"{fig.imbalance:.3f} moved {fig.migrated_experts} experts "
                             f"({fig.solve_s:.2f} s)\n")
            if pdir is not None:
                (pdir / name).mkdir(exist_ok=True)
                p.save(pdir / name / f"step-{fig.step:04d}.json")

        result = run(stream, names, cfg, on_step=on_step)
    result["trace"] = str(trace)
    result["model"] = stream.meta.model
    if plot is not None:
        from sempar.drift.plot import plot_replay

        with atomic_folder(plot, "replay plot", trace, option="--plot") as build:
            plot_replay(result, build / "replay.png")
    if as_json:
        emit_json(result)
    else:
        for name, p in result["policies"].items():
            sys.stdout.write(f"{name:20s} LAR {p['lar_mean']:.4f}  imbalance p95 "
                             f"{p['imbalance_p95']:.3f}  migrated {p['migrated_bytes'] / 1e9:.2f} GB"
                             f"  update {p['solve_s_mean']:.2f} s\n")


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)
