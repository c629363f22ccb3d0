"""CAMoE's two-phase alpha-beta profile of a testbed or loopback processes, with its eq. 9
fidelity check (`sempar profile` and the benchmarks that profile)."""

from __future__ import annotations

from typing import Any

from sempar.errors import InputError


def run_profile(hosts: int, testbed: str | None = None, scale: float = 1 / 8000,
                sizes: list[int] | None = None, reps: int = 3, fidelity: bool = True,
                case_sizes: list[int] | None = None, method: str = "p2p",
                timeout_s: float = 300.0, op_timeout_s: float = 30.0, fault: str | None = None,
                name: str | None = None) -> tuple[Any, dict[str, Any]]:
    """(profiled Topology, result dict) — brings a testbed up and down around the run when
    `testbed` names a preset; loopback processes otherwise. Raises TestbedError/LaunchError."""
    from sempar.testbed import fidelity as F
    from sempar.testbed import netns, profiler, shaping
    from sempar.testbed.launch import launch

    if not 2 <= hosts <= shaping.MAX_HOSTS:
        raise InputError(f"--hosts must be 2..{shaping.MAX_HOSTS}, got {hosts}")
    if reps < 1:
        raise InputError(f"--repeats must be at least 1, got {reps}")
    if method not in F.METHODS:
        raise InputError(f"--method {method!r}: choose one of {', '.join(F.METHODS)}")
    if timeout_s <= 0 or op_timeout_s <= 0:
        raise InputError("--timeout and --op-timeout must be positive")
    sizes = sorted(set(sizes or profiler.DEFAULT_SIZES))
    if len(sizes) < 2:
        raise InputError("--sizes: give at least 2 message sizes (alpha and beta are fitted)")
    if max(sizes) > 1 << 28:
        raise InputError(f"--sizes: {max(sizes)} bytes is more than 256 MiB")
    shaped = shaping.resolve_preset(testbed, hosts) if testbed else None
    if shaped is not None:
        shaping.shaped_rates(shaped, scale)            # checks --scale before anything is created
    cases = F.fidelity_cases(hosts, case_sizes or F.DEFAULT_CASE_SIZES) if fidelity else []
    args = {"profile": {"sizes": sizes, "reps": reps}, "cases": [c["bytes"] for c in cases],
            "reps": reps, "method": method}
    entry = "sempar.testbed.fidelity:profile_and_a2a_rank"
    kw = dict(timeout_s=timeout_s, op_timeout_s=op_timeout_s, fault=fault)
    if shaped is not None:
        with netns.testbed(hosts, shaped, scale, name=name, preset=testbed,
                           ttl_s=timeout_s + 60) as tb:
            out = launch(entry, hosts, args, tb=tb, **kw)
    else:
        out = launch(entry, hosts, args, **kw)
    label = f"profiled-{testbed or 'loopback'}-{hosts}"
    topo, summary = profiler.assemble(out["profile"], name=label,
                                      node_of=None if shaped is None else shaped.node_of)
    result: dict[str, Any] = {"profile": summary, "latency_shaped": False}
    if shaped is not None:
        result["testbed"] = {"preset": testbed, "shaped_topology": shaped.name, "scale": scale,
                             "shaped_bw_Bps": shaping.shaped_rates(shaped, scale).tolist()}
    result["profiled_bw_Bps"] = profiler.bandwidth_matrix(topo).tolist()
    result["profiled_alpha_s"] = topo.alpha[1].tolist()
    if fidelity:
        rep = F.fidelity_report(topo, cases, out["a2a"])
        rep["method"] = method
        result["fidelity"] = rep
        if method == "all_to_all_single":
            topo.collectives = F.gloo_collectives(topo, cases, out["a2a"])
            result["collectives"] = topo.collectives
    return topo, result
