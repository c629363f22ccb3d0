"""Paths for native libraries that take only UTF-8 names (safetensors, tokenizers, HF loaders).

File names are bytes to the OS; Python keeps a name that is not UTF-8 with surrogate escapes
(`os.fsdecode(b"\\xff.safetensors")` == "\\udcff.safetensors"), and a Rust library handed that str
refuses it ("is not valid UTF-8"). `utf8_path` gives such a library a name it can take for the
same file or folder: the path itself when it is UTF-8, else the `/proc/self/fd/N` (or
`/dev/fd/N`) alias of a descriptor opened on it by its bytes. Parquet is opened by bytes
directly (`pyarrow.OSFile(os.fsencode(path))`, sempar.trace.io).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


def is_utf8(path: str | os.PathLike) -> bool:
    """Whether `path` encodes as UTF-8 (no undecodable byte kept as a surrogate escape)."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@contextlib.contextmanager
def utf8_path(path: str | os.PathLike) -> Iterator[str]:
    """A UTF-8 str naming `path` (a file or a folder) while the block runs.

    A folder's alias works as a prefix too (`alias + "/model.safetensors"`)."""
    if is_utf8(path):
        yield os.fspath(path)
        return
    fd = os.open(os.fsencode(path), os.O_RDONLY)
    try:
        for proc in ("/proc/self/fd", "/dev/fd"):
            alias = f"{proc}/{fd}"
            if os.path.exists(alias):
                yield alias
                return
        raise OSError(f"{os.fsdecode(path)!r}: a name that is not UTF-8, and this system has no "
                      "/proc/self/fd to give it to a native library by")
    finally:
        os.close(fd)
