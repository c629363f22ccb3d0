"""Every CLI option that names registry entries is declared with the shared name option
(`commands/_names.names_option`: checked on parsing) and its help, generated at `--help` time,
lists every name its registry holds (issue 34 item 4)."""

from __future__ import annotations

import typer

from sempar.cli import app
from sempar.commands._names import fill_name_helps, names_help

# Options that name a registry entry, wherever they appear; each must be a names_option.
NAMING = {"--engine", "--to", "--accelerator", "--policy", "--policies", "--method", "--methods",
          "--pipeline", "--pipelines", "--systems", "--strategy"}
# Not registry names (why): profile --method picks a measurement (p2p / all_to_all_single), not a
# registered item.
EXEMPT = {("profile", "--method")}


def commands():
    root = typer.main.get_command(app)
    stack = [("", root)]
    while stack:
        name, cmd = stack.pop()
        yield name, cmd
        stack += [(f"{name} {k}".strip(), c) for k, c in getattr(cmd, "commands", {}).items()]


def test_every_naming_option_is_a_names_option_with_generated_help():
    seen = 0
    for name, cmd in commands():
        fill_name_helps(cmd)
        for p in getattr(cmd, "params", ()):
            opts = set(p.opts)
            check = getattr(p, "callback", None)
            registry = getattr(check, "registry", None)
            if opts & NAMING and not any((name, o) in EXEMPT for o in opts):
                assert registry is not None, f"sempar {name} {sorted(opts)}: not a names_option"
            if registry is not None:
                seen += 1
                assert p.help == names_help(check)
                for n in registry().names():
                    assert n in p.help, (name, p.opts, n)
    assert seen >= 12


def test_router_policy_help_names_every_request_policy():
    from sempar.schedule.requests import REQUEST_POLICIES

    router = dict(commands())["router"]
    fill_name_helps(router)
    (policy,) = [p for p in router.params if "--policy" in p.opts]
    assert all(n in policy.help for n in REQUEST_POLICIES.names())
