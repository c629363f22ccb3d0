"""The one output rule of sempar: nothing the user owns is ever modified or deleted by a run.

Files (`atomic_path`): the result is written to a temporary beside the target and renamed over
it only when the target is absent or a regular file. A symlink is followed: its final target is
written (so a link into a shared folder stays a link). Anything else (a folder, a device node
such as /dev/null, a FIFO, a socket) is refused with one line before any work.

Folders (`atomic_folder`): the result is built in a temporary folder beside the target and
swapped in. An absent target is one rename. An existing empty folder, or one sempar wrote
(it holds the `.sempar-output.json` marker listing every file sempar put there, and nothing
else), is emptied into a hidden sibling and refilled, so the folder itself (its inode, owner,
mode, a mount or a shell's working directory on it) is kept. Any other non-empty folder is
refused, or with `force` renamed aside to `NAME.sempar-old-TIMESTAMP` (never deleted).

Inputs: every reader registers what it opens (`register_input`); an output that is an input,
or a folder output that holds one, is refused. `check_output` runs all of these checks up
front, so a command can refuse before it does any work.

Signals: SIGTERM and SIGHUP (like SIGINT) remove every live temporary before the process
exits with 128 + signal, so a killed run leaves nothing behind (design.md, Conventions).
"""

from __future__ import annotations

import contextlib
import json
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

from sempar.errors import InputError

MARKER = ".sempar-output.json"

_live: set[Path] = set()          # temporaries of this process (files or folders we created)
_inputs: set[str] | None = None   # realpaths of the inputs opened, while tracking is on
_handlers_installed = False


# ---- inputs --------------------------------------------------------------------------------

def register_input(path: str | os.PathLike) -> None:
    """Remember `path` as an input of this run; no output may then be written over it."""
    if _inputs is not None:
        _inputs.add(os.path.realpath(path))


def release_input(path: str | os.PathLike) -> None:
    """Forget `path` as an input of this run: only for a run that rewrites its own earlier output
    after reading it (a resumed `sempar capture` copies the requests it had written)."""
    if _inputs is not None:
        _inputs.discard(os.path.realpath(path))


def track_inputs(on: bool = True) -> None:
    """Start (or end) a run: while on, registered inputs are remembered (the CLI's main does).

    Library callers (tests, notebooks) that read and rewrite a file on purpose are unaffected
    unless they call it."""
    global _inputs
    _inputs = set() if on else None


def check_input(path: str | os.PathLike, what: str = "input file", folder: bool = False) -> Path:
    """`path` after checking it is an existing regular file (or folder); registers it as input.

    A FIFO, socket or device is refused: reading one would hang or never end."""
    p = Path(path)
    if str(path).strip() == "":
        raise InputError(f"{what}: the path is empty")
    if not p.exists():
        raise InputError(f"{p}: no such file")
    wrong = _wrong_kind(p, folder)
    if wrong:
        raise InputError(f"{p}: {wrong}, not a {what}")
    register_input(p)
    return p


def _wrong_kind(p: Path, folder: bool) -> str | None:
    """Why `p` (existing) is not a folder / a regular file, or None when it is."""
    mode = p.stat().st_mode
    if folder:
        return None if stat.S_ISDIR(mode) else "exists and is not a folder"
    if stat.S_ISREG(mode):
        return None
    return "is a folder" if stat.S_ISDIR(mode) else "is not a regular file"


def _refuse_inputs(real: str, option: str, folder: bool, extra: tuple = ()) -> None:
    inputs = (_inputs or set()) | {os.path.realpath(p) for p in extra if p is not None}
    for inp in inputs:
        if inp == real or (folder and inp.startswith(real.rstrip(os.sep) + os.sep)):
            what = "is" if inp == real else "holds"
            raise InputError(f"{option}: {real} {what} an input of this run ({inp}); "
                             "choose another output")


# ---- checks --------------------------------------------------------------------------------

def _resolve(target: str | os.PathLike, option: str) -> Path:
    if str(target).strip() == "":
        raise InputError(f"{option}: the path is empty")
    return Path(os.path.realpath(target))   # follows every symlink: the link's target is written


def _check_parent(real: Path, option: str) -> None:
    parent = real.parent
    existing = parent
    while not existing.exists():
        if existing.is_symlink():
            raise InputError(f"{option}: {existing} is a dangling symlink")
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{option}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{option}: {existing} is not writable")


def check_output(target: str | os.PathLike, *inputs: str | os.PathLike | None,
                 option: str = "--out", folder: bool = False) -> Path:
    """The real path `target` will be written at, after every check of the output rule.

    Raises InputError (one line naming `option`) when the target is not a regular file (or, for
    `folder`, a folder), when it is one of `inputs` or a registered input, or when its parent
    cannot be made or written."""
    real = _resolve(target, option)
    _refuse_inputs(str(real), option, folder, inputs)
    if real.exists():
        wrong = _wrong_kind(real, folder)
        if wrong:
            raise InputError(f"{option}: {target} {wrong}; sempar writes "
                             f"{'folders' if folder else 'only regular files'} there")
        if not os.access(real if folder else real.parent, os.W_OK | os.X_OK):
            raise InputError(f"{option}: {real if folder else real.parent} is not writable")
    else:
        _check_parent(real, option)
    return real


# ---- temporaries and signals -------------------------------------------------------------

def _remove_live() -> None:
    for p in list(_live):
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)            # a folder this process created, never a user's
            else:
                p.unlink()
        _live.discard(p)


def _on_signal(signum, frame) -> None:
    _remove_live()
    raise SystemExit(128 + signum)


def install_signal_cleanup() -> None:
    """SIGTERM/SIGHUP remove the live temporaries and exit 128+signal (main thread only).

    A handler someone else installed is left in place."""
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)
    _handlers_installed = True


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
    real.parent.mkdir(parents=True, exist_ok=True)
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
        os.replace(tmp_path, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
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
    with atomic_path(target, option=option) as tmp:
        tmp.write_text(text, encoding="utf-8")


# ---- folders -------------------------------------------------------------------------------

def _files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir() or p.is_symlink()}


def _owned(folder: Path, legacy: Callable[[Path], set[str]] | None) -> set[str] | None:
    """The files sempar wrote in `folder` (by its marker, else `legacy`), or None if unknown."""
    try:
        # a forged marker may be huge or nested 10^5 deep (safe_json imports this module, so
        # the checks are the size here and RecursionError below): then it proves nothing
        if (folder / MARKER).stat().st_size > 16 << 20:
            return legacy(folder) if legacy is not None else None
        listed = json.loads((folder / MARKER).read_text())["files"]
        return set(listed) | {MARKER}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return legacy(folder) if legacy is not None else None


def check_folder_output(target: str | os.PathLike, *inputs: str | os.PathLike | None,
                        option: str = "--out", force: bool = False,
                        legacy: Callable[[Path], set[str]] | None = None) -> Path:
    """`check_output` for a folder, plus: an existing folder must be empty or sempar's own.

    `legacy(folder)` names the files sempar wrote in a folder from before the marker existed."""
    real = check_output(target, *inputs, option=option, folder=True)
    if real.is_dir() and not force:
        present = _files_under(real)
        if present:
            foreign = sorted(present - (_owned(real, legacy) or set()))
            if foreign:
                raise InputError(f"{option}: {target} is a non-empty folder sempar did not write "
                                 f"(it holds {foreign[0]}); give a new or empty folder, or "
                                 "--force to move it aside")
    return real


def _write_marker(build: Path, kind: str) -> None:
    files = sorted(_files_under(build) - {MARKER})
    (build / MARKER).write_text(json.dumps({"written_by": "sempar", "kind": kind,
                                            "files": files}, indent=1) + "\n")


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
                  legacy: Callable[[Path], set[str]] | None = None,
                  marker: bool = True) -> Iterator[Path]:
    """Yield an empty temporary folder beside `target`; swap it in on success.

    See the module docstring for the rule. `kind` names the output in the marker file; outputs
    whose own manifest names their files (`legacy`) may go without a marker (`marker=False`).
    On any exception, SIGTERM or SIGHUP the temporary folder is removed and `target` is
    untouched."""
    install_signal_cleanup()
    real = check_folder_output(target, *inputs, option=option, force=force, legacy=legacy)
    real.parent.mkdir(parents=True, exist_ok=True)
    with _signals_held():
        holder = Path(tempfile.mkdtemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent))
        _live.add(holder)
    try:
        build = holder / "out"
        build.mkdir()
        yield build
        if marker:
            _write_marker(build, kind)
        real = check_folder_output(real, option=option, force=force, legacy=legacy)
        with _signals_held():           # a half-swapped folder would mix old and new files
            _swap_in(build, real, holder, force, legacy)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(holder)           # our own temporary folder (and the replaced output)
        _live.discard(holder)


def _swap_in(build: Path, real: Path, holder: Path, force: bool,
             legacy: Callable[[Path], set[str]] | None) -> None:
    if real.is_dir() and force and _files_under(real):
        owned = _owned(real, legacy)
        if owned is None or _files_under(real) - owned:
            aside = real.with_name(f"{real.name}.sempar-old-{time.strftime('%Y%m%d-%H%M%S')}")
            os.rename(real, aside)          # moved aside, never deleted
            sys.stderr.write(f"moved the existing {real} aside to {aside}\n")
    if not real.exists():
        os.rename(build, real)
        return
    old = holder / "old"
    old.mkdir()
    # Only the files sempar listed (checked just now) are moved out; they go with `holder`.
    owned = (_owned(real, legacy) or set()) & _files_under(real)
    for rel in sorted(owned):
        dst = old / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(real / rel, dst)
    _prune_empty_dirs(real, owned)
    for entry in build.iterdir():
        os.rename(entry, real / entry.name)
