"""Proof of what sempar wrote: a per-user key, a signed ledger of files, and folder markers.

A file counts as sempar's own (`owned_file`) while the signed ledger (`record_output`) lists its
path with its current identity (device, inode, size, mtime, ctime). A folder's files count as
sempar's own (`verified_files`) while its `.sempar-output.json` marker (`write_marker`) carries a
valid HMAC under this user's key (`$XDG_STATE_HOME/sempar/output-key`, else
`$TMPDIR/sempar-UID/output-key`; made on first use, mode 0600) and each file still has its listed
SHA-256. A forged, copied or unsigned marker proves nothing, so nothing is ever deleted on a
marker's word. The output rule (`sempar.output_rule`) decides with these proofs.
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

MARKER = ".sempar-output.json"
MARKER_FORMAT = 2
MARKER_BYTES_MAX = 16 << 20     # a marker lists a folder's files: far below this
LEDGER = "outputs.json"         # beside the key: the files sempar wrote (`record_output`)
LEDGER_ENTRIES_MAX = 4096       # most recent writes remembered; older files count as foreign
LEDGER_BYTES_MAX = 8 << 20


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
