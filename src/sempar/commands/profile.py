"""`sempar profile`: the two-phase alpha-beta profiler (CAMoE Alg. 1) over torch.distributed,
on a namespace testbed (`--testbed PRESET`, root) or on local processes over loopback; writes a
Topology JSON and checks its fidelity against measured all-to-all times (CAMoE eq. 9, Fig. 6).
With `--method all_to_all_single` it also fits gloo's all-to-all serialisation to those times
and records it in the JSON (`collectives`: the `gloo` collective model, comm/collective_models.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from sempar.bounds import HOSTS, POSITIVE_SECONDS, Bounds, NumberList, bound
from sempar.commands._options import ep_option, json_option, renamed
from sempar.console import emit_json
from sempar.errors import InputError
from sempar.testbed.profile_run import run_profile


SIZES = NumberList("--sizes", Bounds(1, 1 << 28, integer=True))    # message bytes, <= 256 MiB


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile_cmd(
        ep: Optional[int] = ep_option(None, "ranks (devices) to profile, one per testbed host, "
                                       "2..64 (--hosts: the same, still read) \\[required]", live=True),
        hosts: Optional[int] = typer.Option(None, "--hosts", hidden=True, callback=HOSTS),
        out: Path = typer.Option(Path("topo.json"), "--out", help="topology JSON to write"),
        testbed: str | None = typer.Option(None, "--testbed", "--preset", help="bring up a "
                                              "namespace testbed shaped as this preset or JSON "
                                              "FILE (root); default: local processes, loopback"),
        scale: float = typer.Option(1 / 8000, "--scale", help="testbed: shaped bytes/s per "
                                    "preset bytes/s (1/8000: 64 GB/s -> 64 Mbit/s)",
                                    callback=bound(0, 1.0, lo_open=True)),
        sizes: str | None = typer.Option(None, "--sizes", help="message sizes in bytes, "
                                            "comma-separated (default 4096,65536,262144,786432)",
                                         callback=SIZES.callback),
        repeats: Optional[int] = typer.Option(None, "--repeats", help="repeats per measurement "
                                              "(median; --reps: the same, still read) \\[default: 3]",
                                              callback=bound(1, 1000)),
        reps: Optional[int] = typer.Option(None, "--reps", hidden=True, callback=bound(1, 1000)),
        fidelity: bool = typer.Option(True, "--fidelity/--no-fidelity",
                                      help="measure all-to-all cases against eq. 9"),
        method: str = typer.Option("p2p", "--method", help="all-to-all measured: p2p (all "
                                   "isend/irecv at once) or all_to_all_single (gloo alltoallv)"),
        plot: Path | None = typer.Option(None, "--plot", help="PNG: predicted vs measured"),
        timeout: float = typer.Option(300.0, "--timeout", help="hard limit of the run, seconds",
                                      callback=POSITIVE_SECONDS),
        op_timeout: float = typer.Option(30.0, "--op-timeout", help="limit of one collective / "
                                         "send / recv, seconds (a dead or hung rank)",
                                         callback=POSITIVE_SECONDS),
        as_json: bool = json_option(),
    ) -> None:
        """Profile alpha-beta per directed pair (CAMoE Alg. 1) and write a Topology JSON."""
        from sempar.commands.testbed import fail_env
        from sempar.testbed.fidelity import plot_fidelity
        from sempar.testbed.netns import TestbedError

        ranks = renamed(ep, hosts, "--ep", "--hosts")
        repeat = renamed(repeats, reps, "--repeats", "--reps", 3)
        if plot is not None and not fidelity:
            raise InputError("--plot needs the fidelity cases (drop --no-fidelity)")
        from sempar.atomic import check_output
        from sempar.output_rule import check_distinct_outputs

        check_distinct_outputs(("--out", out), ("--plot", plot))
        check_output(out)
        if plot is not None:
            check_output(plot, out, option="--plot")
        sz = SIZES.parse(sizes)
        try:
            topo, res = run_profile(ranks, testbed, scale, sz, repeat, fidelity, method=method,
                                    timeout_s=timeout, op_timeout_s=op_timeout)
        except TestbedError as e:
            fail_env(e)
        topo.save(out)
        if plot is not None:
            plot_fidelity(res["fidelity"], plot, title=f"{topo.name}: median |error| "
                          f"{res['fidelity']['median_abs_error'] * 100:.1f} % "
                          f"({res['fidelity']['num_cases']} cases)")
        if as_json:
            emit_json({"topology": str(out), **res})
            return
        _print_summary(topo, res, out)


def _print_summary(topo, res: dict[str, Any], out: Path) -> None:
    import numpy as np

    G = topo.num_devices
    bw = np.asarray(res["profiled_bw_Bps"])
    shaped = np.asarray(res["testbed"]["shaped_bw_Bps"]) if "testbed" in res else None
    print(f"wrote {out}: {topo.name}, {G} devices ({res['profile']['seconds']:.1f} s of profiling)")
    print("pair     profiled MB/s" + ("   shaped MB/s" if shaped is not None else "") +
          "   alpha us (stack latency: not shaped)")
    for u in range(G):
        for v in range(G):
            if u != v:
                s = f"   {shaped[u, v] / 1e6:11.2f}" if shaped is not None else ""
                print(f"{u} -> {v}   {bw[u, v] / 1e6:13.2f}{s}   "
                      f"{res['profiled_alpha_s'][u][v] * 1e6:8.0f}")
    if "fidelity" in res:
        f = res["fidelity"]
        print(f"fidelity ({f['method']}): median |predicted - measured| / measured = "
              f"{f['median_abs_error'] * 100:.1f} % over {f['num_cases']} cases; by kind: " +
              ", ".join(f"{k} {v * 100:.1f} %" for k, v in f["by_kind"].items()))
