"""The output rule, checked before any work: where a run may write, and what it may replace.

An output path (`check_output`; `check_folder_output` for a folder) is refused with one line
naming the option when it
- is empty, or its parent cannot be made or is not writable;
- is not a regular file (a folder, a FIFO, a socket, a device node such as /dev/null), or for a
  folder output not a folder;
- is a symlink that leads nowhere (dangling, or a loop such as `ln -s x x`): sempar writes only
  through links to places that exist;
- is an input of this run, holds one (a folder output), or lies inside an input folder (a model
  folder, a corpus): the inputs are those registered by the readers (`register_input`) and
  those a command names; sempar's own installed package folder always counts as an input
  (`sempar record --out src/sempar/assets/...` would overwrite a packaged trace) unless
  `SEMPAR_WRITE_PACKAGE_ASSETS=1` says the run is sempar's own build tooling;
- in a CLI run, is an existing file sempar did not write: a file output replaces only a file
  this user's sempar wrote and nobody changed since (`owned_file`: a signed ledger of the files
  sempar wrote, with each one's inode, size, mtime and ctime);
- for a folder: holds anything sempar did not verifiably write, unless `force` (then the whole
  folder is moved aside, never deleted); but `force` never moves a symlink's target aside.

What sempar wrote is proven by `sempar.output_proof`: a signed ledger of files and a signed
marker per folder, so nothing is ever deleted on a marker's word. Legacy outputs (from before the
marker, recognised by their own manifest) pass the check but are moved aside, not emptied.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

from sempar.errors import InputError
from sempar.output_proof import MARKER, files_under, owned_file, verified_files

_inputs: set[str] | None = None   # realpaths of the inputs opened, while tracking is on
PACKAGE_ASSETS_ENV = "SEMPAR_WRITE_PACKAGE_ASSETS"


# ---- inputs --------------------------------------------------------------------------------

def register_input(path: str | os.PathLike) -> None:
    """Remember `path` as an input of this run; no output may then be written over or in it."""
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


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def package_folder() -> str:
    """The real path of the installed `sempar` package: its assets are inputs of every run."""
    return os.path.realpath(os.path.dirname(os.path.abspath(__file__)))


def _package_build(real: Path) -> bool:
    """A package asset rewritten by sempar's own build tooling (the environment says so; git
    keeps the committed version, so nothing of a user's is lost)."""
    return os.environ.get(PACKAGE_ASSETS_ENV) == "1" and _inside(str(real), package_folder())


def _refuse_inputs(real: str, option: str, folder: bool, extra: tuple = ()) -> None:
    inputs = (_inputs or set()) | {os.path.realpath(p) for p in extra if p is not None}
    if os.environ.get(PACKAGE_ASSETS_ENV) != "1":
        pkg = package_folder()
        if real == pkg or _inside(real, pkg) or (folder and _inside(pkg, real)):
            raise InputError(f"{option}: {real} is in sempar's own package folder ({pkg}); "
                             "choose an output outside it (sempar's build tooling sets "
                             f"{PACKAGE_ASSETS_ENV}=1)")
    for inp in sorted(inputs):
        if inp == real or (folder and _inside(inp, real)):
            what = "is" if inp == real else "holds"
            raise InputError(f"{option}: {real} {what} an input of this run ({inp}); "
                             "choose another output")
        if _inside(real, inp):
            raise InputError(f"{option}: {real} is inside {inp}, an input folder of this run; "
                             "choose an output outside it")


# ---- checks --------------------------------------------------------------------------------

def _resolve(target: str | os.PathLike, option: str) -> Path:
    """The real path of `target`, every symlink followed; a link that leads nowhere is refused."""
    if str(target).strip() == "":
        raise InputError(f"{option}: the path is empty")
    if os.path.islink(target):
        try:
            os.stat(target)
        except OSError as err:      # ELOOP (ln -s x x), ENOENT (dangling), EACCES
            why = "a symlink loop" if err.errno == 40 else "a dangling symlink"
            raise InputError(f"{option}: {target} is {why}; sempar does not write through it")
    return Path(os.path.realpath(target))


def _writable(folder: Path) -> bool:
    """Whether a file can be made in `folder`, without making one (a refused run touches
    nothing): `os.access`, and a file system with room for files at all. Root passes
    `os.access` on /sys and /proc, kernel file systems of no blocks where no file can be made:
    the run would fail only after its work, naming its temporary file."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        return os.statvfs(folder).f_blocks > 0
    except OSError:
        return True


def _check_parent(real: Path, option: str) -> None:
    parent = real.parent
    existing = parent
    while not existing.exists():
        if existing.is_symlink():
            raise InputError(f"{option}: {existing} is a dangling symlink")
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{option}: {existing} is not a folder")
    if not _writable(existing):
        raise InputError(f"{option}: {existing} is not writable")


def check_output(target: str | os.PathLike, *inputs: str | os.PathLike | None,
                 option: str = "--out", folder: bool = False) -> Path:
    """The real path `target` will be written at, after every check of the output rule.

    Raises InputError (one line naming `option`) when the target is not a regular file (or, for
    `folder`, a folder), a symlink that leads nowhere, one of `inputs` or a registered input (or
    inside an input folder), or when its parent cannot be made or written."""
    real = _resolve(target, option)
    _refuse_inputs(str(real), option, folder, inputs)
    if real.exists():
        wrong = _wrong_kind(real, folder)
        if wrong:
            raise InputError(f"{option}: {target} {wrong}; sempar writes "
                             f"{'folders' if folder else 'only regular files'} there")
        if not _writable(real if folder else real.parent):
            raise InputError(f"{option}: {real if folder else real.parent} is not writable")
        if not folder and _inputs is not None and not owned_file(real) and not _package_build(real):
            link = f" (a symlink to {real})" if os.path.islink(target) else ""
            raise InputError(f"{option}: {target}{link} exists and sempar did not write it (or "
                             "it changed since); sempar never replaces a file it did not "
                             f"write: remove it or choose another {option}")
    else:
        _check_parent(real, option)
    return real


def check_distinct_outputs(*outputs: tuple[str, str | os.PathLike | None]) -> None:
    """One line when two outputs of one run, (option, path) pairs (None: not asked for), are
    the same path or one lies inside the other (a folder output swapped in would remove the
    other's files): each output needs its own place."""
    seen: list[tuple[str, str, str]] = []
    for option, path in outputs:
        if path is None:
            continue
        real = os.path.realpath(path)
        for other, other_path, other_real in seen:
            if real == other_real or _inside(real, other_real) or _inside(other_real, real):
                how = "the same path as" if real == other_real else "nested with"
                raise InputError(f"{option}: {path} is {how} {other} {other_path}; give each "
                                 "output of the run its own path")
        seen.append((option, str(path), real))


def check_folder_output(target: str | os.PathLike, *inputs: str | os.PathLike | None,
                        option: str = "--out", force: bool = False,
                        legacy: Callable[[Path], set[str]] | None = None) -> Path:
    """`check_output` for a folder, plus: an existing folder must be empty or sempar's own.

    `legacy(folder)` names the files sempar wrote in a folder from before the marker existed.
    With `force` a foreign folder may be moved aside, but not one reached through a symlink
    (its target is not a place sempar made)."""
    real = check_output(target, *inputs, option=option, folder=True)
    if real.is_dir():
        # the marker is named last: the message should name a file of the user's
        unverified = sorted(files_under(real) - verified_files(real), key=lambda f: (f == MARKER, f))
        if unverified:
            named = legacy(real) if legacy is not None else set()
            unnamed = [f for f in unverified if f not in named]
            legacy_ok = legacy is not None and not unnamed
            unverified = unnamed or unverified     # name a file neither marker nor legacy knows
            if os.path.islink(target):
                raise InputError(f"{option}: {target} is a symlink to a non-empty folder sempar "
                                 f"did not write (it holds {unverified[0]}); sempar never moves "
                                 "a symlink's target aside: give the folder itself or a new one")
            if not (force or legacy_ok):
                raise InputError(f"{option}: {target} is a non-empty folder sempar did not write "
                                 f"(it holds {unverified[0]}); give a new or empty folder, or "
                                 "--force to move it aside")
    return real
