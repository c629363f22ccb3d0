"""The `sempar` command (design.md, Command-line contract).

Exit codes: 0 success, 2 bad input or usage (one line on stderr naming what is wrong), 1 anything
else. `--json` prints one JSON object on stdout and nothing else there; progress goes to stderr.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import typer
from typer.exceptions import TyperException

from sempar.atomic import install_signal_cleanup, track_inputs
from sempar.commands import register_all
from sempar.console import escaped_std_streams
from sempar.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="sempar: cut expert-parallel communication of MoE inference.")
register_all(app)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app; bad input is one line on stderr and exit code 2.

    Everything written to stdout / stderr meanwhile has its control characters escaped
    (`sempar.console.printable`): names from files never reach the terminal raw."""
    with escaped_std_streams():
        _main(argv)


def _main(argv: Optional[list[str]]) -> None:
    track_inputs()
    install_signal_cleanup()
    try:
        rv = _run(argv)
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
    sys.exit(rv if isinstance(rv, int) else 0)


def _run(argv: Optional[list[str]]) -> Any:
    try:
        return app(args=argv, standalone_mode=False, prog_name="sempar")
    finally:
        track_inputs(False)


def _os_message(e: OSError) -> str:
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    what = e.strerror or str(e) or type(e).__name__
    return f"{where}: {what}" if where else what


def _fail(message: str) -> None:
    sys.stderr.write("error: " + " ".join(message.split()) + "\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
