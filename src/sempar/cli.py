"""The `sempar` command (docs/design.md, Command-line contract).

Exit codes: 0 success, 2 bad input or usage (one line on stderr naming what is wrong), 1 anything
else. `--json` prints one JSON object on stdout and nothing else there; progress goes to stderr.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Optional

import typer
from typer.exceptions import TyperException

from typer.core import TyperGroup

from sempar.atomic import install_signal_cleanup, track_inputs
from sempar.commands import ordered, register_all
from sempar.console import escaped_std_streams
from sempar.errors import InputError


class DataFlowGroup(TyperGroup):
    """The top-level group: its verbs listed in the data flow's order (commands.ORDER), commands
    and command groups together (typer lists all commands before all groups)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return ordered(self.commands)


app = typer.Typer(cls=DataFlowGroup, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False,
                  help="sempar: cut expert-parallel communication of MoE inference.")
register_all(app)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app; bad input is one line on stderr and exit code 2.

    Everything written to stdout / stderr meanwhile has its control characters escaped
    (`sempar.console.printable`): names from files never reach the terminal raw. A library's
    warnings (torch's, numpy's) are held back during the run: after a refusal the error line is
    all stderr says; after a success each distinct one is a `note:` line."""
    with escaped_std_streams():
        _main(argv)


def _main(argv: Optional[list[str]]) -> None:
    track_inputs()
    install_signal_cleanup()
    with warnings.catch_warnings(record=True) as held:
        try:
            rv = _run(argv)
        except BaseException as e:
            if not _refusal(e):
                _show(held)         # a crash or a success by exit: the warnings may matter
            _exit(e)
    _show(held)
    sys.exit(rv if isinstance(rv, int) else 0)


def _refusal(e: BaseException) -> bool:
    """Whether `e` ends the run with the one-line refusal (or a non-zero exit) of the contract."""
    if isinstance(e, (SystemExit, typer.Exit)):
        return getattr(e, "exit_code", getattr(e, "code", 0)) not in (0, None)
    return isinstance(e, (InputError, OSError, TyperException, typer.Abort, KeyboardInterrupt))


def _show(held: list) -> None:
    seen = set()
    for w in held:
        line = f"note: {w.category.__name__}: {' '.join(str(w.message).split())}"
        if line not in seen:
            seen.add(line)
            sys.stderr.write(line + "\n")


def _exit(exc: BaseException) -> None:
    """Exit as the command-line contract says for `exc`; anything unexpected is re-raised."""
    try:
        raise exc
    except InputError as e:
        _fail(str(e))
    except OSError as e:        # the environment refused: missing folder, read-only, full disk
        _fail(_os_message(e))
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("aborted\n")
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except TyperException as e:  # usage errors: unknown option, missing argument, no arguments
        if type(e).__name__ == "NoArgsIsHelpError":  # the help is printed; still a usage error
            sys.exit(2)
        _fail(e.format_message())


@functools.cache
def _command() -> Any:
    """The click command of `app`, built once per process (typer's own `app()` rebuilds it on
    every call: 25 ms, which the in-process tests would pay per case)."""
    return typer.main.get_command(app)


def _run(argv: Optional[list[str]]) -> Any:
    try:
        args = sys.argv[1:] if argv is None else argv
        if {"--help", "-h"} & set(args):
            from sempar.commands._names import fill_name_helps
            # name options list their registry (generated): only the asked command's, so that
            # `sempar --help` imports no registry (numpy, scipy, torch) and answers at once
            fill_name_helps(_asked(_command(), args), recursive=False)
        return _command().main(args=argv, standalone_mode=False, prog_name="sempar")
    finally:
        track_inputs(False)


def _asked(command: Any, args: list[str]) -> Any:
    """The command whose help `args` asks for: the group path its leading words name."""
    for word in args:
        sub = getattr(command, "commands", {}).get(word)
        if sub is None:
            if not word.startswith("-"):
                break
            continue
        command = sub
    return command


def _os_message(e: OSError) -> str:
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    what = e.strerror or str(e) or type(e).__name__
    return f"{where}: {what}" if where else what


def _fail(message: str) -> None:
    sys.stderr.write("error: " + " ".join(message.split()) + "\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
