"""`sempar rebalance`: an incremental re-placement step from a window of recent routing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import bound
from sempar.commands._options import ep_option, json_option

MOVES_MAX = 1_000_000


def rebalance(placement: Path = typer.Option(..., "--placement", help="the serving placement.json"),
              trace: Path = typer.Option(..., "--trace", help="window of recent routing (Parquet)"),
              ep: int = ep_option(..., "EP degree G (must be the placement's)"),
              max_moves: Optional[int] = typer.Option(
                  None, "--max-moves", callback=bound(0, MOVES_MAX),
                  help="moves at most (a swap is one move; default 64, unlimited with --max-bytes)"),
              max_bytes: Optional[float] = typer.Option(
                  None, "--max-bytes", callback=bound(0.0, 1e15),
                  help="copied expert bytes at most"),
              max_imbalance: float = typer.Option(1.10, "--max-imbalance", callback=bound(1.0, 100.0),
                                                  help="per-layer max/mean served load on the window"),
              horizon: float = typer.Option(300.0, "--horizon", callback=bound(0.0, 1e9, lo_open=True),
                                            help="s: a locality move must pay its copy back within"),
              tokens_per_s: float = typer.Option(20000.0, "--tokens-per-s",
                                                 callback=bound(0.0, 1e12, lo_open=True),
                                                 help="deployment token throughput (cost model)"),
              link_gbps: float = typer.Option(50.0, "--link-gbps", callback=bound(0.0, 1e6, lo_open=True),
                                              help="GB/s weights are copied at (copy time)"),
              expert_bytes: Optional[float] = typer.Option(
                  None, "--expert-bytes", callback=bound(0.0, 1e15, lo_open=True),
                  help="bytes of one expert (default: from the model's shape)"),
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
    cfg = config(window.meta.model, max_moves, max_bytes, max_imbalance, horizon, tokens_per_s,
                 link_gbps, expert_bytes, remote_bytes)
    new, res = step(cur, window.experts, cfg)
    new.save(out_file)
    j = res.to_json(cfg)
    sys.stderr.write(f"wrote {out_file}: {j['num_moves']} moves, {j['expert_copies']} expert "
                     f"copies ({j['copied_bytes'] / 1e9:.2f} GB); window LAR {j['lar_before']:.4f} "
                     f"-> {j['lar_after']:.4f}, imbalance {j['imbalance_before']:.3f} -> "
                     f"{j['imbalance_after']:.3f} ({res.solve_s:.2f} s)\n")
    if as_json:
        emit_json({"path": str(out_file), "parent": new.info["parent"], **j})


def config(model: str, max_moves: Optional[int], max_bytes: Optional[float], max_imbalance: float,
           horizon: float, tokens_per_s: float, link_gbps: float,
           expert_bytes: Optional[float], remote_bytes: Optional[float] = None):
    """The `RebalanceConfig` of the options; the bytes from the model's shape unless given."""
    from sempar.drift.costs import expert_bytes as bytes_of, remote_activation_bytes
    from sempar.placement.rebalance import RebalanceConfig

    eb = float(expert_bytes) if expert_bytes is not None else float(bytes_of(model))
    rb = float(remote_bytes) if remote_bytes is not None else float(remote_activation_bytes(model))
    return RebalanceConfig(max_moves=max_moves if max_moves is not None else
                           (64 if max_bytes is None else MOVES_MAX),
                           max_bytes=max_bytes, max_imbalance=max_imbalance,
                           expert_bytes=eb, remote_bytes=rb,
                           tokens_per_s=tokens_per_s, horizon_s=horizon, link_gbps=link_gbps)


def register(app: typer.Typer) -> None:
    app.command("rebalance")(rebalance)
