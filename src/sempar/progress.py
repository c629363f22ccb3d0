"""Progress bars on stderr (rich), silent when stderr is not a terminal unless forced.

A run that fails leaves no progress line behind: its error is the only line on stderr."""

from __future__ import annotations

import contextlib
from typing import Iterator

from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from sempar.console import err as stderr  # the same console the verbs write stderr with
from sempar.console import printable  # descriptions may name files: no raw control characters


@contextlib.contextmanager
def _shown(columns: list) -> Iterator[Progress]:
    """A started Progress; on any exception it stops without printing its last state."""
    prog = Progress(*columns, console=stderr, transient=False)
    prog.start()
    try:
        yield prog
    except BaseException:
        prog.live.transient = True
        quiet, stderr.quiet = stderr.quiet, True
        try:
            prog.stop()
        finally:
            stderr.quiet = quiet
        raise
    prog.stop()


@contextlib.contextmanager
def progress_bar(description: str, total: int | None) -> Iterator:
    """Yield `advance(n)`; a bar with ETA on stderr (a spinner when total is None)."""
    columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with _shown(columns) as prog:
        task = prog.add_task(printable(description), total=total)
        yield lambda n=1: prog.advance(task, n)


@contextlib.contextmanager
def steps(description: str, total: int) -> Iterator:
    """Yield `step(message)` for work made of `total` named steps."""
    columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn()]
    with _shown(columns) as prog:
        task = prog.add_task(printable(description), total=total)
        first = [True]

        def step(message: str) -> None:
            if not first[0]:
                prog.advance(task)
            first[0] = False
            prog.update(task, description=printable(f"{description}: {message}"))

        yield step
        prog.update(task, completed=total, description=printable(f"{description}: done"))
