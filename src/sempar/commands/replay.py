"""`sempar replay`: serve a drift stream under re-placement policies, step by step, side by side."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import REQUESTS_MAX, bound
from sempar.commands._options import ep_option, json_option, names_option, seed_option
from sempar.commands.rebalance import MOVES_MAX


def _policies():
    from sempar.drift.policies import POLICIES

    return POLICIES


def replay(trace: Path = typer.Option(..., "--trace", help="stream trace: requests in arrival "
                                                          "order (`sempar drift` makes one)"),
           ep: int = ep_option(..., "EP degree G (devices)"),
           policies: str = names_option("static,resolve,eplb-periodic,sempar-incremental",
                                        "--policies", _policies, help="policies to compare"),
           every: int = typer.Option(16, "--every", callback=bound(1, REQUESTS_MAX),
                                     help="requests served per step (policies update between)"),
           window: int = typer.Option(32, "--window", callback=bound(1, REQUESTS_MAX),
                                      help="requests an update sees (the last served)"),
           max_steps: Optional[int] = typer.Option(None, "--max-steps",
                                                   callback=bound(1, REQUESTS_MAX),
                                                   help="stop after this many steps"),
           max_moves: int = typer.Option(64, "--max-moves", callback=bound(0, MOVES_MAX),
                                         help="sempar-incremental: moves per update"),
           max_imbalance: float = typer.Option(1.05, "--max-imbalance", callback=bound(1.0, 100.0),
                                               help="sempar-incremental: the window's bound (as "
                                                    "`place`'s fit cap, for 1.10 on new requests)"),
           history: int = typer.Option(3, "--history", callback=bound(0, 64),
                                       help="sempar-incremental: windows of load history "
                                            "beyond --window its bound also holds on"),
           horizon: float = typer.Option(300.0, "--horizon", callback=bound(0.0, 1e9, lo_open=True),
                                         help="s: sempar-incremental's payback horizon"),
           tokens_per_s: float = typer.Option(20000.0, "--tokens-per-s",
                                              callback=bound(0.0, 1e12, lo_open=True),
                                              help="deployment token throughput (cost model)"),
           expert_bytes: Optional[float] = typer.Option(
               None, "--expert-bytes", callback=bound(0.0, 1e15, lo_open=True),
               help="bytes of one expert (default: from the model's shape)"),
           seed: int = seed_option(),
           jobs: Optional[int] = typer.Option(1, "--jobs", callback=bound(1, 4096),
                                              help="worker processes of the sempar solves"),
           plot: Optional[Path] = typer.Option(None, "--plot", help="folder for the time-series PNG"),
           placements: Optional[Path] = typer.Option(
               None, "--placements", help="folder for every step's placement.json per policy "
                                          "(`sempar export` turns one into an engine's file)"),
           as_json: bool = json_option()) -> None:
    """Replay a stream: every --every requests each policy may update its placement from the
    last --window requests; per step exact-home LAR, imbalance, migrated bytes, solve time."""
    from contextlib import ExitStack

    from sempar.atomic import atomic_folder, check_folder_output
    from sempar.commands.rebalance import config
    from sempar.drift.history import History
    from sempar.console import emit_json
    from sempar.drift.policies import ReplayConfig
    from sempar.drift.replay import replay as run
    from sempar.trace import read_trace

    from sempar.output_rule import check_distinct_outputs

    check_distinct_outputs(("--plot", plot), ("--placements", placements))
    for option, folder in (("--plot", plot), ("--placements", placements)):
        if folder is not None:
            check_folder_output(folder, trace, option=option)
    stream = read_trace(trace, optional=("domain",))
    names = [n.strip() for n in policies.split(",") if n.strip()]
    rb = config(stream.meta.model, max_moves, None, max_imbalance, horizon, tokens_per_s, 50.0,
                expert_bytes)
    cfg = ReplayConfig(ep=ep, every=every, window=window, max_steps=max_steps, seed=seed,
                       jobs=jobs, rebalance=rb, history=History(windows=history))
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
