"""`sempar rebalance`: an incremental re-placement step from a window of recent routing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import bound
from sempar.commands._options import ep_option, json_option
from sempar.drift.costs import MOVES_MAX

# The cost-model options `rebalance` and `replay` share (None: the library's default, declared
# once in `RebalanceConfig`); (flag, low, high, help).
_COST = {"horizon": ("--horizon", 0.0, 1e9, "s: a locality move must pay its copy back within "
                                           "(default 300)"),
         "tokens_per_s": ("--tokens-per-s", 0.0, 1e12, "deployment token throughput, cost model "
                                                       "(default 20000)"),
         "expert_bytes": ("--expert-bytes", 0.0, 1e15, "bytes of one expert (default: from the "
                                                       "model's shape)")}


def cost_option(name: str, prefix: str = "") -> Optional[float]:
    """One of the shared cost-model options (`_COST`), default None; `prefix` leads its help."""
    flag, lo, hi, text = _COST[name]
    return typer.Option(None, flag, callback=bound(lo, hi, lo_open=True), help=prefix + text)


def moves_option(help: str) -> Optional[int]:
    """`--max-moves`, default None (`RebalanceConfig`'s)."""
    return typer.Option(None, "--max-moves", callback=bound(0, MOVES_MAX), help=help)


def imbalance_option(help: str) -> Optional[float]:
    """`--max-imbalance`, default None (the library's)."""
    return typer.Option(None, "--max-imbalance", callback=bound(1.0, 100.0), help=help)


def rebalance(placement: Path = typer.Option(..., "--placement", help="the serving placement.json"),
              trace: Path = typer.Option(..., "--trace", help="window of recent routing (Parquet)"),
              ep: int = ep_option(..., "EP degree G (must be the placement's)"),
              max_moves: Optional[int] = moves_option(
                  "moves at most (a swap is one move; default 64, unlimited with --max-bytes)"),
              max_bytes: Optional[float] = typer.Option(
                  None, "--max-bytes", callback=bound(0.0, 1e15),
                  help="copied expert bytes at most"),
              max_imbalance: Optional[float] = imbalance_option(
                  "per-layer max/mean served load on the window (default 1.10)"),
              horizon: Optional[float] = cost_option("horizon"),
              tokens_per_s: Optional[float] = cost_option("tokens_per_s"),
              link_gbps: Optional[float] = typer.Option(
                  None, "--link-gbps", callback=bound(0.0, 1e6, lo_open=True),
                  help="GB/s weights are copied at, copy time (default 50)"),
              expert_bytes: Optional[float] = cost_option("expert_bytes"),
              remote_bytes: Optional[float] = typer.Option(
                  None, "--remote-bytes", callback=bound(0.0, 1e12, lo_open=True),
                  help="bytes one remote activation moves, both ways (default: 2 x hidden x "
                       "dtype bytes of the model)"),
              out_file: Path = typer.Option(..., "--out", help="next placement.json to write"),
              as_json: bool = json_option()) -> None:
    """Move few experts so that the window's exact-home LAR rises within the imbalance bound;
    report the moves, their bytes and the expected gain."""
    from sempar.atomic import check_output
    from sempar.console import emit_json
    from sempar.drift.config import rebalance_config
    from sempar.errors import InputError
    from sempar.placement import Placement
    from sempar.placement.rebalance import check_window, rebalance as step
    from sempar.trace import read_trace

    check_output(out_file, placement, trace)
    cur = Placement.load(placement)
    if cur.num_devices != ep:
        raise InputError(f"--ep {ep}: the placement has {cur.num_devices} devices")
    window = read_trace(trace, optional=())
    check_window(cur, window.meta)
    cfg = rebalance_config(window.meta.model, expert_bytes=expert_bytes,
                           remote_bytes=remote_bytes, max_moves=max_moves, max_bytes=max_bytes,
                           max_imbalance=max_imbalance, horizon_s=horizon,
                           tokens_per_s=tokens_per_s, link_gbps=link_gbps)
    new, res = step(cur, window.experts, cfg)
    new.save(out_file)
    j = res.to_json(cfg)
    sys.stderr.write(f"wrote {out_file}: {j['num_moves']} moves, {j['expert_copies']} expert "
                     f"copies ({j['copied_bytes'] / 1e9:.2f} GB); window LAR {j['lar_before']:.4f} "
                     f"-> {j['lar_after']:.4f}, imbalance {j['imbalance_before']:.3f} -> "
                     f"{j['imbalance_after']:.3f} ({res.solve_s:.2f} s)\n")
    if as_json:
        emit_json({"path": str(out_file), "parent": new.info["parent"], **j})


def register(app: typer.Typer) -> None:
    app.command("rebalance")(rebalance)
