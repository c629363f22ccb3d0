"""A user's `.npz` / `.npy` files as one namespace of arrays, read without running code.

An `.npz` contributes its keys, an `.npy` its file stem (`experts.npy` -> `experts`); a name given
twice is refused. Files are opened with `allow_pickle=False` (`.npy` memory-mapped); an `.npz`
member is refused before numpy allocates it when its header claims more bytes than the member
can hold, or an object dtype. `DEFAULT_KEYS` are the names tried for each role of
`sempar.trace.arrays.import_arrays`.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sempar.errors import InputError

DEFAULT_KEYS: dict[str, tuple[str, ...]] = {
    "experts": ("experts",), "weights": ("weights", "probs"),
    "token_id": ("token_id", "token_ids", "input_ids"), "request_offsets": ("request_offsets",),
    "request_id": ("request_id", "request_ids"), "position": ("position", "positions"),
    "domain": ("domain",), "request_domain": ("request_domain", "request_category"),
    "domain_names": ("domains", "categories"), "layer_ids": ("layer_ids",)}


class Arrays:
    """The arrays of the given files by name, loaded on first use."""

    def __init__(self, paths: Sequence[str | os.PathLike]):
        from sempar.atomic import check_input

        self.where: dict[str, str] = {}
        self._src: dict[str, Any] = {}
        if not paths:
            raise InputError("import arrays: no .npz or .npy file given")
        for p in map(Path, paths):
            check_input(p, ".npz / .npy file")
            try:
                obj = np.load(p, allow_pickle=False, mmap_mode="r")
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
                reason = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise InputError(f"{p}: not a readable .npz / .npy file ({reason[:160]})") from None
            names = obj.files if isinstance(obj, np.lib.npyio.NpzFile) else [p.stem]
            for n in names:
                if n in self.where:
                    raise InputError(f"{p}: array {n!r} is also in {self.where[n]}")
                self.where[n] = str(p)
                self._src[n] = obj if isinstance(obj, np.lib.npyio.NpzFile) else np.asarray(obj)
        self.used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> np.ndarray:
        src = self._src[name]
        try:
            if isinstance(src, np.lib.npyio.NpzFile):
                why = _check_member(src, name)
                if why:
                    raise InputError(f"{name} ({self.where[name]}): {why}")
            a = src[name] if isinstance(src, np.lib.npyio.NpzFile) else src
        except InputError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise InputError(f"{name} ({self.where[name]}): cannot be read "
                             f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
        self.used.add(name)
        return a

    def role(self, role: str, key: str | None) -> tuple[str | None, np.ndarray | None]:
        """(name, array) of `role`: `key` when given ("" = none), else its first default name
        present; (None, None) when absent."""
        if key is not None:
            if key == "":
                return None, None
            if key not in self.where:
                raise InputError(f"--{role.replace('_', '-')}-key {key}: no such array "
                                 f"(the files hold: {', '.join(sorted(self.where))})")
            return key, self.get(key)
        for name in DEFAULT_KEYS[role]:
            if name in self.where:
                return name, self.get(name)
        return None, None


DEFLATE_RATIO_MAX = 1032     # deflate cannot expand more than this (RFC 1951's longest match)


def _check_member(npz: Any, name: str) -> str | None:
    """Why to refuse an .npz member (None: none) whose header claims more bytes than the member holds, before
    numpy allocates the array its header describes (a 40-byte member can claim 179 GiB; the
    plain .npy form is memory-mapped and numpy refuses it there itself). The member's size is
    the zip's, itself bounded by its compressed size times deflate's largest ratio."""
    from numpy.lib import format as npf

    zf = npz.zip
    member = name if name in zf.namelist() else name + ".npy"
    info = zf.getinfo(member)
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else DEFLATE_RATIO_MAX
    size = min(info.file_size, info.compress_size * ratio)
    with zf.open(member) as f:
        version = npf.read_magic(f)
        read = npf.read_array_header_1_0 if version == (1, 0) else npf.read_array_header_2_0
        shape, _, dtype = read(f)
        header = f.tell()
    count = int(np.prod(shape, dtype=object)) if shape else 1
    claimed = header + count * dtype.itemsize
    if dtype.hasobject:
        return "an object array (never unpickled)"
    if claimed > size:
        return (f"its header claims {shape} x {dtype.itemsize} bytes, more than the {size} "
                "bytes the member holds")
    return None
