"""Atomic outputs: a run's result appears whole at its path, or not at all.

The checks of the output rule (what may be written where, what sempar may replace) are in
`sempar.output_rule` and re-exported here; this module writes.

Files (`atomic_path`): the result is written to a temporary beside the target and renamed over
it only when the target is absent or a regular file (in a CLI run: one sempar wrote, see
`output_proof.owned_file`; each file written is added to the signed ledger). A symlink to a regular file is followed:
its final target is written (so a link into a shared folder stays a link). Anything else (a
folder, a device node such as /dev/null, a FIFO, a socket, a dangling or looping symlink) is
refused with one line before any work. Folders the write had to make are removed again when it
fails (a full disk leaves no empty folder).

Folders (`atomic_folder`): the result is built in a temporary folder beside the target and
swapped in. An absent target is one rename. An existing empty folder, or one whose every file
sempar provably wrote (its signed `.sempar-output.json` marker lists each file's hash), is
emptied into a hidden sibling and refilled, so the folder itself (its inode, owner, mode, a
mount or a shell's working directory on it) is kept. Any other non-empty folder is refused, or
with `force` renamed aside to `NAME.sempar-old-TIMESTAMP` (never deleted).

Signals: SIGTERM and SIGHUP (like SIGINT) remove every live temporary before the process
exits with 128 + signal, so a killed run leaves nothing behind (docs/design.md, Conventions).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from sempar.output_proof import (MARKER, files_under, owned_file, record_output,  # noqa: F401
                                 verified_files, write_marker)
from sempar.output_rule import (check_folder_output, check_input, check_output,  # noqa: F401
                                register_input, release_input, track_inputs)

_live: set[Path] = set()          # temporaries of this process (files or folders we created)
_handlers_installed = False
_signalled: int | None = None     # 128 + the SIGTERM / SIGHUP this process took, once taken


def _make_parents(real: Path) -> list[Path]:
    """mkdir -p `real.parent`; the folders this call made, deepest first (to undo on failure)."""
    made = []
    d = real.parent
    while not d.exists():
        made.append(d)
        d = d.parent
    real.parent.mkdir(parents=True, exist_ok=True)
    return made


def _remove_made(made: list[Path]) -> None:
    """Remove the folders `_make_parents` made, if still empty: a failed run leaves none."""
    for d in made:
        with contextlib.suppress(OSError):
            d.rmdir()


# ---- temporaries and signals -------------------------------------------------------------

def _remove_live() -> None:
    for p in list(_live):
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)            # a folder this process created, never a user's
            else:
                p.unlink()
        _live.discard(p)


# Seconds the unwinding after SIGTERM / SIGHUP may take before the process exits anyway.
EXIT_GRACE_S = 10


def _on_signal(signum, frame) -> None:
    """Remove the live temporaries, then exit with 128 + signum by unwinding (SystemExit: every
    `finally`, pool and writer cleans up), with a hard exit as a backstop.

    Why the backstop: a Python signal handler runs at whatever bytecode the main thread reaches
    next, and an exception it raises can be discarded by C code that clears errors. Seen in
    `sempar synth` about one run in ten under load: the signal landed while numpy.random's
    Cython modules were being initialised (imported lazily at the first `np.random` use, right
    after the temporary is made), Cython's module set-up cleared the pending SystemExit, and the
    run went on to the end with its temporary already gone. So the handler also arms SIGALRM:
    if the process is still alive `EXIT_GRACE_S` seconds later (the exit was lost, or the
    unwinding hangs), it leaves by `os._exit` with the same code; the temporaries are already
    removed. No lock is taken here (a handler may interrupt a thread's start).
    A lost exit can also let the run reach its commit before the alarm: `_refuse_if_signalled`
    there and the atexit hook keep a signalled run from swapping an output in or exiting 0."""
    global _signalled
    _remove_live()
    code = 128 + signum
    _signalled = code
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGALRM, lambda *_: os._exit(code))
        signal.alarm(EXIT_GRACE_S)
    raise SystemExit(code)


def install_signal_cleanup() -> None:
    """SIGTERM/SIGHUP remove the live temporaries and exit 128+signal (main thread only).

    A handler someone else installed is left in place."""
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)
    atexit.register(_exit_if_signalled)
    _handlers_installed = True


def _refuse_if_signalled() -> None:
    """Called just before an output is swapped in: a run that took SIGTERM / SIGHUP (whose
    exit some C code swallowed) must not commit."""
    if _signalled is not None:
        raise SystemExit(_signalled)


def _exit_if_signalled() -> None:
    """atexit: a signalled run that reached a normal exit leaves with 128 + signal, its
    temporaries removed."""
    if _signalled is not None:
        _remove_live()
        os._exit(_signalled)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGTERM/SIGHUP/SIGINT (main thread) while a temporary is made and registered, or an
    output swapped in: a signal then lands before or after, never between the two steps."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = "", option: str = "--out") -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it onto `target` on success.

    `target` is checked by `check_output` first. On any exception, SIGTERM or SIGHUP the
    temporary file is removed and `target` is left untouched."""
    install_signal_cleanup()
    real = check_output(target, option=option)
    made = _make_parents(real)
    with _signals_held():
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=suffix + ".tmp", dir=real.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        _live.add(tmp_path)
    try:
        # mkstemp creates 0600; an existing target keeps its mode, a new one gets open()'s.
        mode = stat.S_IMODE(real.stat().st_mode) if real.exists() else 0o666 & ~_umask()
        os.chmod(tmp_path, mode)
        yield tmp_path
        check_output(real, option=option)     # still a regular file (or absent) right now
        with _signals_held():
            _refuse_if_signalled()
            os.replace(tmp_path, real)
        record_output(real)                   # sempar's own now: a later run may replace it
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        _remove_made(made)
        raise
    finally:
        _live.discard(tmp_path)


@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[Path]:
    """A private working folder in $TMPDIR for one run: made by this process, removed when the
    block ends, on any exception, and on SIGTERM / SIGHUP (it is a live temporary)."""
    install_signal_cleanup()
    with _signals_held():
        work = Path(tempfile.mkdtemp(prefix=prefix))
        _live.add(work)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)     # made by mkdtemp above, never a user's
        _live.discard(work)


def write_text_atomic(target: str | os.PathLike, text: str, option: str = "--out") -> None:
    """Write `text` as UTF-8 atomically. A non-UTF-8 file name quoted in it (a surrogate escape)
    is written as `\\udcff`: the file stays valid UTF-8 and the write never fails on a name."""
    with atomic_path(target, option=option) as tmp:
        tmp.write_text(text, encoding="utf-8", errors="backslashreplace")


# ---- folders -------------------------------------------------------------------------------

def _prune_empty_dirs(folder: Path, files: set[str]) -> None:
    """Remove the folders that held `files` (relative to `folder`) once they are empty."""
    dirs = {folder / Path(rel).parent for rel in files} - {folder}
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        while d != folder:
            with contextlib.suppress(OSError):
                d.rmdir()
            d = d.parent


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike, kind: str, *inputs: str | os.PathLike | None,
                  option: str = "--out", force: bool = False,
                  legacy: Callable[[Path], set[str]] | None = None) -> Iterator[Path]:
    """Yield an empty temporary folder beside `target`; swap it in on success.

    See the module docstring for the rule. `kind` names the output in the marker file;
    `legacy(folder)` names the files of an output from before the marker (recognised, then
    moved aside rather than emptied).
    On any exception, SIGTERM or SIGHUP the temporary folder is removed and `target` is
    untouched."""
    install_signal_cleanup()
    real = check_folder_output(target, *inputs, option=option, force=force, legacy=legacy)
    made = _make_parents(real)
    with _signals_held():
        holder = Path(tempfile.mkdtemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent))
        _live.add(holder)
    try:
        build = holder / "out"
        build.mkdir()
        yield build
        write_marker(build, kind)
        real = check_folder_output(target, *inputs, option=option, force=force, legacy=legacy)
        with _signals_held():           # a half-swapped folder would mix old and new files
            _refuse_if_signalled()
            _swap_in(build, real, holder)
        made = []
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(holder)           # our own temporary folder (and the replaced output)
        _live.discard(holder)
        _remove_made(made)                  # after the holder, which sat in them


def _swap_in(build: Path, real: Path, holder: Path) -> None:
    """Put `build`'s files at `real`. Only files sempar provably wrote (`verified_files`) are
    replaced; a folder holding anything else (forced, or a legacy output) is moved aside whole."""
    if real.is_dir() and files_under(real) - verified_files(real):
        aside = real.with_name(f"{real.name}.sempar-old-{time.strftime('%Y%m%d-%H%M%S')}")
        os.rename(real, aside)          # moved aside, never deleted
        sys.stderr.write(f"moved the existing {real} aside to {aside}\n")
    if not real.exists():
        os.rename(build, real)
        return
    old = holder / "old"
    old.mkdir()
    # Only the files sempar wrote (checked just now) are moved out; they go with `holder`.
    owned = verified_files(real) & files_under(real)
    for rel in sorted(owned):
        dst = old / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(real / rel, dst)
    _prune_empty_dirs(real, owned)
    for entry in build.iterdir():
        os.rename(entry, real / entry.name)
