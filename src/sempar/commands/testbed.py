"""`sempar testbed up|down|status`: network namespaces with per-pair shaped bandwidth
(sempar.testbed.netns). Needs root, `ip` and `tc`; bandwidth only (this kernel has no netem)."""

from __future__ import annotations

import sys
import time

import typer

from sempar.bounds import HOSTS, POSITIVE_SECONDS, bound
from sempar.commands._options import json_option
from sempar.errors import InputError


def fail_env(e: Exception) -> None:
    """Environment failure (not root, tc refused, a rank died): one line, exit code 1."""
    sys.stderr.write("error: " + " ".join(str(e).split()) + "\n")
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    tb_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Network-namespace testbed: one host per rank, bandwidth shaped per "
                         "directed pair (htb; latency cannot be shaped: no netem).")
    app.add_typer(tb_app, name="testbed")

    @tb_app.command("up")
    def up(hosts: int = typer.Option(..., "--hosts", help="number of hosts (namespaces), 2..64",
                                     callback=HOSTS),
           preset: str = typer.Option("pcie-upi8", "--preset", help="topology preset "
                                      "(pcie-upi8, a100x4-ib[:N], ...) or topology JSON FILE"),
           scale: float = typer.Option(1 / 8000, "--scale", help="shaped bytes/s per preset "
                                       "bytes/s (default 1/8000: 64 GB/s -> 64 Mbit/s)",
                                       callback=bound(0, 1.0, lo_open=True)),
           name: str | None = typer.Option(None, "--name", help="testbed name (default t<pid>)"),
           ttl: float = typer.Option(3600.0, "--ttl", help="seconds until a later up/status/down "
                                     "removes it", callback=POSITIVE_SECONDS),
           as_json: bool = json_option()) -> None:
        """Create the namespaces, bridge, addresses and shaping; `down` removes them."""
        from sempar.console import emit_json
        from sempar.testbed import netns, shaping

        if ttl <= 0:
            raise InputError(f"--ttl must be positive, got {ttl}")
        topo = shaping.resolve_preset(preset, hosts)
        try:
            tb = netns.create(hosts, topo, scale, name=name, preset=preset, ttl_s=ttl)
        except netns.TestbedError as e:
            fail_env(e)
        d = tb.to_json()
        d["latency_shaped"] = False
        if as_json:
            emit_json(d)
            return
        sys.stderr.write(f"testbed {tb.name}: {hosts} hosts shaped as {topo.name} x {scale:g} "
                         f"(bandwidth only, no latency: no netem); expires in {ttl:.0f} s\n")
        for i in range(hosts):
            rates = ", ".join(f"->{v} {tb.rates[i][v] * 8 / 1e6:.1f}" for v in range(hosts) if v != i)
            print(f"{tb.host_ns(i)}  {tb.addr(i)}  Mbit/s {rates}")

    @tb_app.command("down")
    def down(name: str | None = typer.Argument(None, help="testbed name (default: every "
                                                  "testbed and stray sempar-* namespace)"),
             as_json: bool = json_option()) -> None:
        """Remove a testbed (or all of them): namespaces, veths, bridge, state file."""
        from sempar.console import emit_json
        from sempar.testbed import netns

        kept: list = []
        try:
            removed, kept = (netns.destroy(name), []) if name else netns.down_all()
        except netns.TestbedError as e:
            fail_env(e)
        if as_json:
            emit_json({"removed": removed, "kept": [tb.name for tb in kept]})
        else:
            sys.stderr.write(f"removed {len(removed)} namespace(s)\n")
        for tb in kept:
            sys.stderr.write(f"kept testbed {tb.name}: in use by running process {tb.owner_pid} "
                             f"(`sempar testbed down {tb.name}` removes it anyway)\n")

    @tb_app.command("status")
    def status(as_json: bool = json_option()) -> None:
        """List recorded testbeds and every sempar-* namespace present."""
        from sempar.console import emit_json
        from sempar.testbed import netns

        reaped = netns.reap_expired() if netns.netns_available()[0] else []
        beds = [tb.to_json() for tb in netns.list_testbeds()]
        present = netns.existing_namespaces()
        if as_json:
            emit_json({"testbeds": beds, "namespaces": present, "reaped": reaped})
            return
        for b in beds:
            left = b["expires"] - time.time()
            print(f"{b['name']}: {b['hosts']} hosts, {b['preset']} x {b['scale']:g}, "
                  f"expires in {left:.0f} s")
        print(f"{len(present)} sempar namespace(s) present" + (f": {' '.join(present)}"
                                                               if present else ""))
