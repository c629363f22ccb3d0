"""The router's request policies: `schedule.requests.REQUEST_POLICIES`, read as it is (one
registry: each class declares its capabilities, `needs_scores` = it reads the placement's token
table, `balances`, `summary`), so `sempar router --policy NAME` runs the same class that `sempar
evaluate --mode dp --online --policy NAME` and `serve-sim` run, in its streaming form.
`router_command` writes the `sempar router` line of a deployment, for `sempar plan`.
"""

from __future__ import annotations

DEFAULT_POLICY = "expert-idf"   # the best three-seed mean on GPT-OSS-20B at EP 4 (docs/router.md)


def request_policies():
    """The one registry of request policies (each module of schedule/ registers on import)."""
    import sempar.schedule  # noqa: F401  (registers the load-aware policies too)
    from sempar.schedule.requests import REQUEST_POLICIES

    return REQUEST_POLICIES


def reads_table(name: str) -> bool:
    """Whether policy `name` scores ranks from the placement's token table."""
    return bool(request_policies().get(name).needs_scores)


def make_router_policy(name: str, dp_size: int, table):
    """The streaming request policy `name` (a fresh state); the table only if it reads one."""
    from sempar.schedule.requests import make_policy

    return make_policy(name, dp_size, table if reads_table(name) else None)


def router_command(placement: str, upstream: str, engine: str, dp_size: int, model_dir: str,
                   policy: str = DEFAULT_POLICY, port: int = 30080) -> str | None:
    """The `sempar router` command line in front of `engine`'s `dp_size` ranks, or None when
    `policy` is the engine's own request placement (no router needed)."""
    from sempar.router.engines import ENGINES

    request_policies().get(policy)
    if policy == ENGINES.get(engine).native_policy:
        return None
    return (f"sempar router --placement {placement} --upstream {upstream} --engine {engine} "
            f"--dp-size {dp_size} --model-dir {model_dir} --policy {policy} --port {port}")
