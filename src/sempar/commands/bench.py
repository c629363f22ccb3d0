"""`sempar bench`: real expert-parallel prefill of the tiny 64-expert model, vanilla vs exflow vs
sempar, on the namespace testbed (root) or over loopback: the verb and its console table; the
orchestration is `sempar.bench`, the execution `sempar.runtime`."""

from __future__ import annotations

import sys

import typer

from sempar.bounds import POSITIVE_SECONDS, bound
from sempar.commands._names import names_option
from sempar.commands._options import ep_option, json_option


def _methods():
    from sempar.bench.plan import METHODS

    return METHODS


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench_cmd(
        ep: int = ep_option(4, "devices (G, the EP degree): one rank per testbed host",
                           live=True, also=("--hosts",)),
        preset: str = typer.Option("pcie-upi8", "--preset", help="testbed topology preset "
                                   "(pcie-upi8, a100x4-ib, or a topology JSON FILE) or `none` "
                                   "for loopback; without root / netns: loopback"),
        scale: float = typer.Option(1 / 8000, "--scale", help="testbed: shaped bytes/s per "
                                    "preset bytes/s (1/8000: 64 GB/s -> 8 MB/s)",
                                    callback=bound(0, 1.0, lo_open=True)),
        batches: int = typer.Option(2, "--batches", help="prefill batches (distinct held-out "
                                    "requests each)", callback=bound(1, 1000)),
        batch_size: int = typer.Option(8, "--batch-size", help="requests per batch",
                                        callback=bound(1, 4096)),
        seq: int = typer.Option(128, "--seq", help="tokens per request", callback=bound(1, 65536)),
        repeats: int = typer.Option(3, "--repeats", help="timed forwards per batch (min)",
                                     callback=bound(1, 1000)),
        methods: str | None = names_option(None, "--methods", _methods,
                                           help="comma-separated subset"),
        timeout: float = typer.Option(600.0, "--timeout", help="hard limit of the run, seconds",
                                      callback=POSITIVE_SECONDS),
        as_json: bool = json_option(),
        model: str = typer.Option("tiny-moe64", "--model", help="packaged model with a dev "
                                  "trace: tiny-moe64, or tiny-moe64-h8 (8 heads: TP at G = 8)"),
    ) -> None:
        """MoE-block, attention-collective, layer and forward time, bytes (measured and
        predicted), LAR and logit error per method; the result is also saved for `sempar demo`
        ($SEMPAR_BENCH_RESULT)."""
        from sempar.console import emit_json
        from sempar.commands.testbed import fail_env
        from sempar.bench import run_bench
        from sempar.runtime.dist import RankFailure
        from sempar.testbed.netns import TestbedError

        from sempar.atomic import check_output
        from sempar.bench.result import result_path

        # the result is saved for `sempar demo`: its path is checked now, not after the run
        check_output(result_path(), option="$SEMPAR_BENCH_RESULT")
        ms = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
        progress = None if as_json else (lambda s: sys.stderr.write(s + "\n"))
        try:
            res = run_bench(ep, preset, scale, batches, batch_size, seq, repeats, ms,
                            model=model, timeout_s=timeout, progress=progress)
        except (TestbedError, RankFailure) as e:
            fail_env(e)
        if as_json:
            emit_json(res)
            return
        print_table(res)


def print_table(res: dict) -> None:
    from rich.table import Table

    from sempar.bench import TABLE_HEADER, bench_table_rows

    where = (f"testbed {res['preset']} x {res['scale']:g}" if res["preset"] else "loopback")
    t = Table(title=f"sempar bench: {res['model']}, G={res['hosts']}, {where}, "
                    f"{res['batches']} x {res['batch_size']} x {res['seq']} tokens, "
                    f"min of {res['repeats']}, median over batches")
    for i, h in enumerate(TABLE_HEADER):
        t.add_column(h, justify="left" if i < 2 else "right")
    for row in bench_table_rows(res):
        t.add_row(*row)
    from sempar.console import SafeConsole

    con = SafeConsole()
    con.width = max(con.width, 150)
    con.print(t)
    for m, why in res.get("skipped", {}).items():
        print(f"skipped {m}: {why}")
    if res.get("note"):
        print(res["note"])
