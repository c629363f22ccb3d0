"""Options naming items of a registry (solvers, pipelines, policies, dispatch rules, engines,
accelerators, serving systems): each comma-separated name is checked on parsing against the
registry (`names_option`, `check_names`), and the option's help, listing every registered name,
is generated only when help is asked for (`fill_name_helps`), so a plain run imports no registry
it does not use."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

import typer

from sempar.errors import InputError


def check_names(option: str, text: Optional[str], registry: Any,
                words: tuple[str, ...] = (), single: bool = False) -> Optional[list[str]]:
    """The names of a comma-separated option value, each registered in `registry` (or one of
    `words`, e.g. "all"); an unknown one is refused naming the known ones; with `single`, one
    name only. None for None."""
    if text is None:
        return None
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    if not names:
        raise InputError(f"{option}: {text!r} names nothing")
    if single and len(names) > 1:
        raise InputError(f"{option}: {text!r} names {len(names)}; give one")
    for n in names:
        if n not in registry and n not in words:
            known = ", ".join([*words, *registry.names()])
            raise InputError(f"{option}: unknown {registry.kind} {n!r}; choose one of: {known}")
    return names


class WithAliases:
    """A registry seen with extra spellings (`aliases`: alias -> name, matched case-insensitively),
    for `names_option` where the verb resolves aliases itself (stream's strategies)."""

    def __init__(self, registry: Any, aliases: dict[str, str]):
        self.registry, self.aliases, self.kind = registry, aliases, registry.kind

    def __contains__(self, name: object) -> bool:
        return name in self.registry or str(name).lower() in self.aliases

    def names(self) -> list[str]:
        return [*self.registry.names(), *self.aliases]


def names_option(default: Optional[str], option: str, registry: Callable[[], Any], help: str,
                 words: tuple[str, ...] = (), single: bool = False) -> Any:
    """An option naming one or more (comma-separated) items of the registry `registry()` returns
    (imported when the option is given, not when the CLI is built); checked on parsing. The
    callback's `registry` attribute lets the tests try an unknown name on every such option."""
    def check(value: Optional[str]) -> Optional[str]:
        check_names(option, value, registry(), words, single)
        return value

    check.registry = registry                                # type: ignore[attr-defined]
    check.words = words                                      # type: ignore[attr-defined]
    check.single = single                                    # type: ignore[attr-defined]
    check.help = help                                        # type: ignore[attr-defined]
    return typer.Option(default, option, help=help, callback=check)


def names_help(check: Any) -> str:
    """The help of a `names_option`, generated: its own words, then every name its registry
    holds (`one of` / `any of`)."""
    names = [*check.words, *check.registry().names()]
    return f"{check.help}; {'one' if check.single else 'any'} of: {', '.join(names)}"


def lazy_help_option(default: Any, option: str, help: Callable[[], str]) -> Any:
    """An option whose help `help()` is generated at `--help` time (`fill_name_helps`): help that
    names what a heavy module holds (numpy, pyarrow) without importing it when the CLI is built."""
    def keep(value: Any) -> Any:
        return value

    keep.help_text = help                                    # type: ignore[attr-defined]
    return typer.Option(default, option, help="", callback=keep)


def fill_name_helps(command: Any, recursive: bool = True) -> None:
    """Write the generated help (`names_help`, `lazy_help_option`'s) into every such option of the
    click command `command` (and, `recursive`, of the commands under it). Called only when help
    is asked for, and then only for the command asked about (cli.py), so a plain run, and
    `sempar --help`, import no registry they do not use."""
    for param in getattr(command, "params", ()):
        check = getattr(param, "callback", None)
        if getattr(check, "registry", None) is not None:
            param.help = names_help(check)
        elif getattr(check, "help_text", None) is not None:
            param.help = check.help_text()
    for sub in getattr(command, "commands", {}).values() if recursive else ():
        fill_name_helps(sub)


def lazy_registry(module: str, name: str, doc: str = "") -> Callable[[], Any]:
    """A function returning the registry `name` of `module`, imported on the first call (when
    the option is given or its help asked for), not when the CLI is built."""
    def get() -> Any:
        return getattr(importlib.import_module(module), name)

    get.__doc__ = doc or f"{module}.{name}"
    return get


solvers = lazy_registry("sempar.placement", "SOLVERS",
                        "The placement methods' registry (each solver module registers itself on "
                        "import).")
pipelines = lazy_registry("sempar.comm.pipelines", "PIPELINES")
request_policies = lazy_registry("sempar.schedule.requests", "REQUEST_POLICIES")
dispatch_rules = lazy_registry("sempar.placement.dispatch", "DISPATCH",
                               "The dispatch rules' registry (placement/dispatch.py).")
capture_engines = lazy_registry("sempar.capture.engines", "ENGINES")
export_targets = lazy_registry("sempar.export.engines", "ENGINES")
accelerators = lazy_registry("sempar.serving.hardware", "ACCELERATORS")
router_engines = lazy_registry("sempar.router.engines", "ENGINES")
serving_systems = lazy_registry("sempar.serving.systems", "SYSTEMS")


def dispatch_option() -> Any:
    """--dispatch: which copy of a replicated expert serves each activation."""
    return names_option("nearest", "--dispatch", dispatch_rules, single=True,
                        help="with --redundant: the rule choosing, per engine step, the copy "
                             "that serves each activation (figures after dispatch)")
