"""Benchmark: the two-phase alpha-beta profiler (CAMoE Alg. 1) on the namespace testbed.

Brings up G hosts shaped as a preset (default pcie-upi8 at G=4: hosts 0,1 on socket 0 and
2,3 on socket 1; 64 GB/s and 20 GB/s scaled by 1/8000 to 8 MB/s and 2.5 MB/s), profiles them,
measures all-to-all cases (uniform, skewed, hot) and prints:
  - profiled bandwidth per directed pair beside the shaped one (and their ratio);
  - alpha per pair: the stack's own latency (Python + gloo + TCP + veth), since this kernel has
    no netem and latency is not shaped;
  - fidelity: median |eq. 9 predicted - measured| / measured over the cases, per kind, for the
    concurrent send/recv all-to-all (`p2p`) and, with --both, gloo's all_to_all_single;
  - with --both, the gloo collective model (`sempar profile --method all_to_all_single`): the
    serialisation fitted to those gloo times and its median |error| beside eq. 9's, and their
    ratio (below 1: the fit is nearer live gloo timings; in-sample, the fit's own cases).
Needs root (`ip netns`, tc htb); everything it creates is removed on exit.

    python benchmarks/bench_profile.py [--hosts 4] [--preset pcie-upi8] [--scale 0.000125]
                                       [--reps 3] [--plot fid.png] [--both] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from sempar.testbed.profile_run import run_profile
from sempar.testbed.fidelity import (fidelity_cases, fidelity_report, gloo_collectives,
                                      plot_fidelity)
from sempar.testbed.launch import launch
from sempar.testbed.netns import netns_available, testbed
from sempar.testbed.shaping import resolve_preset


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--preset", default="pcie-upi8")
    ap.add_argument("--scale", type=float, default=1 / 8000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--both", action="store_true", help="also measure gloo all_to_all_single")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ok, why = netns_available()
    if not ok:
        print(f"bench_profile: needs the namespace testbed ({why})", file=sys.stderr)
        return 1
    t0 = time.time()
    topo, res = run_profile(a.hosts, a.preset, a.scale, reps=a.reps)
    out = {"hosts": a.hosts, "preset": a.preset, "scale": a.scale, "latency_shaped": False,
           "topology": topo.name, "wall_s": None,
           "shaped_bw_Bps": res["testbed"]["shaped_bw_Bps"],
           "profiled_bw_Bps": res["profiled_bw_Bps"], "profiled_alpha_s": res["profiled_alpha_s"],
           "profile_seconds": res["profile"]["seconds"],
           "fidelity": {"p2p": {k: res["fidelity"][k] for k in
                                ("median_abs_error", "num_cases", "by_kind", "cases")}}}
    if a.plot:
        plot_fidelity(res["fidelity"], a.plot, title=f"{a.preset} G={a.hosts} x {a.scale:g}: "
                      f"median |error| {res['fidelity']['median_abs_error'] * 100:.1f} %")
    if a.both:          # gloo's alltoallv on the same cases, predicted with the same profile
        cases = fidelity_cases(a.hosts)
        with testbed(a.hosts, resolve_preset(a.preset, a.hosts), a.scale, preset=a.preset) as tb:
            meas = launch("sempar.testbed.fidelity:a2a_rank", a.hosts,
                          {"cases": [c["bytes"] for c in cases], "reps": a.reps,
                           "method": "all_to_all_single"}, tb=tb, timeout_s=300)
        rep = fidelity_report(topo, cases, meas)
        out["fidelity"]["all_to_all_single"] = {k: rep[k] for k in ("median_abs_error",
                                                                    "num_cases", "by_kind", "cases")}
        out["gloo_fit"] = gloo_collectives(topo, cases, meas)
    out["wall_s"] = round(time.time() - t0, 1)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    shaped, prof = np.asarray(out["shaped_bw_Bps"]), np.asarray(out["profiled_bw_Bps"])
    G = a.hosts
    print(f"{a.preset} on {G} namespace hosts, bandwidth x {a.scale:g} (latency not shaped: "
          f"no netem); profile {out['profile_seconds']:.1f} s, wall {out['wall_s']} s")
    print("pair    shaped MB/s  profiled MB/s  ratio  alpha us")
    for u in range(G):
        for v in range(G):
            if u != v:
                print(f"{u} -> {v}  {shaped[u, v] / 1e6:11.2f}  {prof[u, v] / 1e6:13.2f}  "
                      f"{prof[u, v] / shaped[u, v]:5.2f}  {out['profiled_alpha_s'][u][v] * 1e6:8.0f}")
    off = ~np.eye(G, dtype=bool)
    print(f"profiled / shaped bandwidth: median {np.median(prof[off] / shaped[off]):.3f}, "
          f"range {np.min(prof[off] / shaped[off]):.3f} .. {np.max(prof[off] / shaped[off]):.3f}")
    for meth, f in out["fidelity"].items():
        print(f"fidelity [{meth}]: median abs error {f['median_abs_error'] * 100:.1f} % over "
              f"{f['num_cases']} cases (" + ", ".join(f"{k} {v * 100:.1f} %"
                                                    for k, v in f["by_kind"].items()) + ")")
        for c in f["cases"]:
            print(f"   {c['name']:>16}  predicted {c['predicted_s'] * 1e3:7.1f} ms  measured "
                  f"{c['measured_s'] * 1e3:7.1f} ms  error {c['rel_error'] * 100:5.1f} %")
    if "gloo_fit" in out:
        g = out["gloo_fit"]
        ratio = g["median_abs_error"] / g["median_abs_error_eq9"] if g["median_abs_error_eq9"] \
            else float("nan")
        print(f"gloo all_to_all_single over {g['cases']} cases: median abs error eq. 9 "
              f"{g['median_abs_error_eq9'] * 100:.1f} %, fitted serialisation "
              f"{g['a2a_serialisation']:.3f} {g['median_abs_error'] * 100:.1f} %, "
              f"fitted / eq. 9 {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
