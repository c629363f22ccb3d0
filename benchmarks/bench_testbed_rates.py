"""Benchmark: does the namespace testbed run at the rates it shapes? (the figures
tests/testbed/test_testbed_netns.py used to assert: a raw TCP stream within 15 % of the shaped rate, the
profiled bandwidths within 15 % of the shaped ones, eq. 9 within 15 % of measured).

On pcie-upi8 at 3 hosts (0->1 8 MB/s, 0->2 2.5 MB/s at the default scale): a 1 MiB raw TCP
stream per pair, measured rate / shaped rate; then `sempar profile` (CAMoE Alg. 1): median
|profiled / shaped - 1| over the directed pairs and eq. 9's median |error| on the measured
all-to-all cases, each beside its 0.15 target. Needs root (`ip netns`, tc htb); everything it
creates is removed on exit. bench_profile.py has the profile's figures per pair and kind.

    python benchmarks/bench_testbed_rates.py [--reps 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from sempar.testbed.profile_run import run_profile
from sempar.testbed import netns, shaping

TARGET = 0.15
SRV = ("import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)"
       "\ns.bind(('0.0.0.0',5000));s.listen(1);c,_=s.accept()\nwhile c.recv(1<<20):pass\n"
       "c.sendall(b'k')")
CLI = ("import socket,sys,time\ns=socket.create_connection((sys.argv[1],5000));t=time.time()"
       "\ns.sendall(b'x'*(1<<20));s.shutdown(socket.SHUT_WR);s.recv(1)\n"
       "print((1<<20)/(time.time()-t))")


def tcp_rates() -> list[dict]:
    topo = shaping.resolve_preset("pcie-upi8", 3)
    shaped = {1: 8e6, 2: 2.5e6}
    out = []
    with netns.testbed(3, topo, name=f"br{os.getpid()}") as tb:
        for dst in (1, 2):
            p = subprocess.Popen(["ip", "netns", "exec", tb.host_ns(dst), sys.executable, "-c", SRV])
            time.sleep(0.5)
            r = subprocess.run(["ip", "netns", "exec", tb.host_ns(0), sys.executable, "-c", CLI,
                                tb.addr(dst)], capture_output=True, text=True, timeout=30)
            p.wait(timeout=10)
            rate = float(r.stdout)
            out.append({"figure": f"TCP 0->{dst} rate / shaped", "value": rate / shaped[dst] - 1,
                        "measured_Bps": rate, "shaped_Bps": shaped[dst]})
    return out


def profile_figures(reps: int) -> list[dict]:
    _, res = run_profile(3, "pcie-upi8", reps=reps)
    shaped = np.asarray(res["testbed"]["shaped_bw_Bps"])
    prof = np.asarray(res["profiled_bw_Bps"])
    off = ~np.eye(3, dtype=bool)
    return [{"figure": "profiled / shaped bandwidth, median over pairs",
             "value": float(np.median(np.abs(prof[off] / shaped[off] - 1)))},
            {"figure": "eq. 9 median |error| on measured all-to-alls",
             "value": float(res["fidelity"]["median_abs_error"])}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ok, why = netns.netns_available()
    if not ok:
        print(f"bench_testbed_rates: needs the namespace testbed ({why})", file=sys.stderr)
        return 1
    rows = tcp_rates() + profile_figures(a.reps)
    for r in rows:
        r["target"] = TARGET
        r["met"] = abs(r["value"]) <= TARGET
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'figure':50s} {'|error|':>8s} {'target':>7s}")
    for r in rows:
        print(f"{r['figure']:50s} {abs(r['value']):8.3f} {TARGET:7.2f}  "
              f"{'MET' if r['met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
