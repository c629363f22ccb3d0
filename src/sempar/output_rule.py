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

What sempar wrote is known by the `.sempar-output.json` marker of the folder: each file's
SHA-256 and an HMAC over the list under a per-user key (`$XDG_STATE_HOME/sempar/output-key`, else
`$TMPDIR/sempar-UID/output-key`; made on first use, mode 0600). A file counts as sempar's own only
while the marker's HMAC is valid and the file's content still has the listed hash: a forged or
copied marker, or a file edited since, makes the folder foreign (refused, or moved aside with
`force`), so nothing is ever deleted on a marker's word. Legacy outputs (from before the marker,
recognised by their own manifest) pass the check but are moved aside, not emptied.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Callable

from sempar.errors import InputError

MARKER = ".sempar-output.json"
MARKER_FORMAT = 2
MARKER_BYTES_MAX = 16 << 20     # a marker lists a folder's files: far below this

_inputs: set[str] | None = None   # realpaths of the inputs opened, while tracking is on
LEDGER = "outputs.json"         # beside the key: the files sempar wrote (`record_output`)
LEDGER_ENTRIES_MAX = 4096       # most recent writes remembered; older files count as foreign
LEDGER_BYTES_MAX = 8 << 20
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


# ---- what sempar wrote: the signed marker ----------------------------------------------------

def _key_paths() -> list[Path]:
    """Where this user's marker key lives: the state folder, else (a read-only home) a private
    folder in the temporary directory."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return [Path(state) / "sempar" / "output-key",
            Path(tempfile.gettempdir()) / f"sempar-{os.getuid()}" / "output-key"]


def _read_key(path: Path) -> bytes | None:
    """The key at `path`, if it is a regular file of ours no one else can read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        try:
            key = bytes.fromhex(f.read().strip())
        except ValueError:
            return None
    return key if len(key) >= 16 else None


def _key(create: bool) -> bytes | None:
    """This user's marker key (32 random bytes), made on first use; None when unavailable."""
    found = _key_and_path(create)
    return found[0] if found else None


def _key_and_path(create: bool) -> tuple[bytes, Path] | None:
    for path in _key_paths():
        key = _read_key(path)
        if key is not None or not create:
            if key is not None:
                return key, path
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
        except FileExistsError:
            pass                        # another run made it meanwhile: read theirs
        except OSError:
            continue                    # read-only home: try the next place
        key = _read_key(path)
        if key is not None:
            return key, path
    return None                         # markers go unsigned, and are never trusted


# ---- what sempar wrote: the signed ledger of files -------------------------------------------

def _identity(st: os.stat_result) -> list[int]:
    """What changes when anyone writes, truncates, replaces or chmods a file: its device, inode,
    size, mtime and ctime (ctime cannot be set back from user space)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _ledger_read(key: bytes, path: Path) -> dict[str, list[int]]:
    """The ledger's entries when its HMAC is valid under `key`, else none (nothing is trusted)."""
    try:
        if path.stat().st_size > LEDGER_BYTES_MAX:
            return {}
        block = json.loads(path.read_text())
        files, mac = block["files"], block["mac"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return {}
    if not isinstance(files, dict) or not isinstance(mac, str) or \
            not hmac.compare_digest(_mac(key, "ledger", files), mac):
        return {}
    return files


def owned_file(real: str | os.PathLike) -> bool:
    """Whether sempar (this user's, this key) wrote the regular file `real` and no one changed it
    since: the signed ledger lists its path with its current identity."""
    found = _key_and_path(create=False)
    if found is None:
        return False
    key, kpath = found
    try:
        ident = _identity(os.stat(real))
    except OSError:
        return False
    return _ledger_read(key, kpath.parent / LEDGER).get(os.path.realpath(real)) == ident


def record_output(real: str | os.PathLike) -> None:
    """Add the file just written at `real` to the ledger (under an exclusive lock: concurrent
    runs each add theirs). Best effort: a ledger that cannot be written makes the file foreign
    later (refused, never replaced), which is the safe side."""
    import fcntl

    found = _key_and_path(create=True)
    if found is None:
        return
    key, kpath = found
    path = kpath.parent / LEDGER
    try:
        real = os.path.realpath(real)
        ident = _identity(os.stat(real))
        fd = os.open(kpath.parent / (LEDGER + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                     0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        files = _ledger_read(key, path)
        files.pop(real, None)
        files[real] = ident                          # insertion order: oldest first
        if len(files) > LEDGER_ENTRIES_MAX:          # forget files gone or changed, then oldest
            files = {p: i for p, i in files.items() if _still(p, i)}
            files = dict(list(files.items())[-LEDGER_ENTRIES_MAX:])
        block = {"written_by": "sempar", "format": MARKER_FORMAT, "files": files,
                 "mac": _mac(key, "ledger", files)}
        tmp = path.with_name(f".{LEDGER}.{os.getpid()}.tmp")
        fd2 = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd2, "w") as f:
            f.write(json.dumps(block))
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        os.close(fd)


def _still(path: str, ident: list[int]) -> bool:
    try:
        return _identity(os.stat(path)) == ident
    except OSError:
        return False


_hash_memo: dict[tuple, str] = {}


def _sha256(path: Path) -> str:
    """Hex SHA-256 of a regular file's content (memoised per inode, size and mtime)."""
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _hash_memo:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _hash_memo[key] = h.hexdigest()
    return _hash_memo[key]


def _mac(key: bytes, kind: str, files: dict[str, str]) -> str:
    body = json.dumps({"format": MARKER_FORMAT, "kind": kind, "files": files}, sort_keys=True)
    return hmac.new(key, body.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def files_under(folder: Path) -> set[str]:
    """Every non-folder entry below `folder` (symlinks included), relative to it."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir() or p.is_symlink()}


def write_marker(build: Path, kind: str) -> None:
    """List every file of `build` with its SHA-256 in the marker, signed with this user's key."""
    files = {rel: _sha256(build / rel) for rel in sorted(files_under(build) - {MARKER})
             if (build / rel).is_file() and not (build / rel).is_symlink()}
    key = _key(create=True)
    block = {"written_by": "sempar", "format": MARKER_FORMAT, "kind": kind, "files": files,
             "mac": _mac(key, kind, files) if key else None}
    (build / MARKER).write_text(json.dumps(block, indent=1) + "\n")


def verified_files(folder: Path) -> set[str]:
    """The files of `folder` that sempar provably wrote: listed in a marker whose HMAC is valid
    under this user's key, still a regular file, with the listed content hash (and the marker)."""
    try:
        # a forged marker may be huge or nested 10^5 deep: then it proves nothing
        if (folder / MARKER).stat().st_size > MARKER_BYTES_MAX:
            return set()
        block = json.loads((folder / MARKER).read_text())
        kind, files, mac = block["kind"], block["files"], block["mac"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return set()
    key = _key(create=False)
    if (key is None or not isinstance(files, dict) or not isinstance(mac, str)
            or not hmac.compare_digest(_mac(key, str(kind), files), mac)):
        return set()
    ok = {MARKER}
    for rel, digest in files.items():
        p = folder / rel
        # A listed name is trusted only as a path below the folder (the HMAC says we wrote the
        # list; the checks say the file there now is the one we wrote).
        if ".." in Path(rel).parts or os.path.isabs(rel) or p.is_symlink() or not p.is_file():
            continue
        if _sha256(p) == digest:
            ok.add(rel)
    return ok


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
