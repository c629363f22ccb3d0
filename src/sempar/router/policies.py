"""The router's request policies, registered by name with their capabilities.

Each is a policy of `schedule.requests.REQUEST_POLICIES` (the same class `sempar evaluate
--mode dp --online --policy NAME` and `serve-sim` run; the router calls its streaming form).
`router_command` writes the `sempar router` line of a deployment, for `sempar plan`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sempar.registry import Registry


@dataclass(frozen=True)
class RouterPolicy:
    """request_policy: its name in REQUEST_POLICIES; reads_table: it scores ranks from the
    placement's token table (the router then needs a placement that has one); summary: one
    line for `--help` and the docs."""

    request_policy: str
    reads_table: bool
    summary: str


ROUTER_POLICIES: Registry[RouterPolicy] = Registry("router policy")
ROUTER_POLICIES.add("expert", RouterPolicy("expert", True, "Alg. 2's affinity under load bounds"))
ROUTER_POLICIES.add("round-robin", RouterPolicy("round-robin", False, "request r to rank r mod G"))
ROUTER_POLICIES.add("least-inflight", RouterPolicy("least-inflight", False,
                                                   "fewest in-flight tokens"))
ROUTER_POLICIES.add("expert+prefix", RouterPolicy("expert+prefix", True,
                                                  "expert plus a prefix-cache affinity term"))
ROUTER_POLICIES.add("expert-idf", RouterPolicy("expert-idf", True,
                                               "expert on idf-weighted, rank-debiased scores"))
ROUTER_POLICIES.add("alg2", RouterPolicy("alg2", True, "Sem-MoE Alg. 2 as written (rounds of G)"))
ROUTER_POLICIES.add("balanced", RouterPolicy("balanced", True,
                                             "Alg. 2's scores within in-flight token bounds"))


def make_router_policy(name: str, dp_size: int, table):
    """The streaming request policy behind router policy `name` (a fresh state)."""
    from sempar.schedule.requests import make_policy

    return make_policy(ROUTER_POLICIES.get(name).request_policy, dp_size,
                       table if ROUTER_POLICIES.get(name).reads_table else None)


def router_command(placement: str, upstream: str, engine: str, dp_size: int, model_dir: str,
                   policy: str = "expert", port: int = 30080) -> str | None:
    """The `sempar router` command line in front of `engine`'s `dp_size` ranks, or None when
    `policy` is the engine's own request placement (no router needed)."""
    from sempar.router.engines import ENGINES

    ROUTER_POLICIES.get(policy)
    if policy == ENGINES.get(engine).native_policy:
        return None
    return (f"sempar router --placement {placement} --upstream {upstream} --engine {engine} "
            f"--dp-size {dp_size} --model-dir {model_dir} --policy {policy} --port {port}")
