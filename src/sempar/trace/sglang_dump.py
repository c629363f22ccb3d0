"""One SGLang expert-distribution dump file (`per_token` mode), read and checked.

The file's layout and what each field means are in `sempar.trace.sglang`'s docstring. Files are
read with `torch.load(weights_only=True)` (no code runs); a missing key, a wrong shape or an id
out of range raises `InputError` naming the file, the record and the field. `scan_dump` makes one
pass over a file (its shape, the layers and slots used, per-record keys for de-duplicating
attention-TP ranks) so the import can size the trace before converting any record.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sempar.errors import InputError

MAP_KEY = "last_physical_to_logical_map"
REQUIRED = ("input_ids", "positions", "topk_ids_of_layer")
DECODE_MODE = 2  # SGLang ForwardMode: EXTEND = 1, DECODE = 2, MIXED = 3, IDLE = 4, ...
INT32_MAX = int(np.iinfo(np.int32).max)
_RANK_RE = re.compile(r"_(\d+)\.pt$")


def load_dump(path: Path) -> dict:
    import torch

    from sempar.atomic import check_input

    check_input(path, "SGLang .pt dump")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle, zip and weights-only errors alike
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{path}: not a readable SGLang dump (torch.load with weights_only: "
                         f"{reason[:200]})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path}: top level is {type(obj).__name__}, expected a dict with "
                         f"'records' and '{MAP_KEY}'")
    for key in ("records", MAP_KEY):
        if key not in obj:
            raise InputError(f"{path}: missing key '{key}' (not a per_token expert-distribution dump)")
    if not isinstance(obj["records"], (list, tuple)):
        raise InputError(f"{path}: records: {type(obj['records']).__name__} is not a list")
    return obj


def _int_array(value: Any, where: str, ndim: int) -> np.ndarray:
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise InputError(f"{where}: dtype {value.dtype} is not an integer type")
        arr = value.detach().cpu().numpy()
        if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise InputError(f"{where}: value {int(arr.max())} does not fit int64")
        arr = arr.astype(np.int64)
    elif isinstance(value, (list, tuple)):
        try:
            arr = np.asarray(value, dtype=np.int64) if len(value) else np.zeros((0,) * ndim, np.int64)
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"{where}: not a list of integers") from None
    else:
        raise InputError(f"{where}: {type(value).__name__} is not an integer tensor or list")
    if arr.ndim != ndim:
        raise InputError(f"{where}: shape {tuple(arr.shape)} is not {ndim}-D")
    return arr


def dump_map(obj: dict, path: Path) -> np.ndarray:
    m = _int_array(obj[MAP_KEY], f"{path}: {MAP_KEY}", 2)
    if m.size == 0:
        raise InputError(f"{path}: {MAP_KEY}: empty, shape {tuple(m.shape)}")
    if (m < 0).any():
        l, p = (int(i) for i in np.argwhere(m < 0)[0])
        raise InputError(f"{path}: {MAP_KEY}: layer {l} physical {p}: logical id {int(m[l, p])} "
                         "is negative")
    return m


@dataclass
class Record:
    """One validated record: int64 arrays in dump layout."""

    input_ids: np.ndarray   # [T]
    positions: np.ndarray   # [T]
    topk: np.ndarray        # [L, T, K] physical ids, -1 = none
    seq_lens: np.ndarray | None
    forward_pass_id: Any
    forward_mode: Any
    rank: int | None


def read_record(rec: Any, i: int, path: Path, L: int, P: int) -> Record:
    where = f"{path}: record {i}"
    if not isinstance(rec, dict):
        raise InputError(f"{where}: {type(rec).__name__} is not a dict")
    for key in REQUIRED:
        if key not in rec:
            raise InputError(f"{where}: missing field '{key}'")
    ids = _int_array(rec["input_ids"], f"{where}: input_ids", 1)
    pos = _int_array(rec["positions"], f"{where}: positions", 1)
    topk = _int_array(rec["topk_ids_of_layer"], f"{where}: topk_ids_of_layer", 3)
    T = ids.shape[0]
    if pos.shape[0] != T:
        raise InputError(f"{where}: positions: {pos.shape[0]} values for {T} input_ids")
    if topk.shape[0] != L or topk.shape[1] != T:
        raise InputError(f"{where}: topk_ids_of_layer: shape {tuple(topk.shape)}, expected "
                         f"[layers={L}, tokens={T}, k] ({MAP_KEY} has {L} layers)")
    if (ids < 0).any():
        t = int(np.argmax(ids < 0))
        raise InputError(f"{where}: input_ids: token {t}: id {int(ids[t])} is negative")
    # ids and positions are stored as int32 (trace/schema.py): a larger value would wrap onto
    # another one (2**32 + 5 -> 5), so it is refused here rather than narrowed
    for name, a in (("input_ids", ids), ("positions", pos)):
        if (a > INT32_MAX).any():
            t = int(np.argmax(a > INT32_MAX))
            raise InputError(f"{where}: {name}: token {t}: value {int(a[t])} does not fit int32")
    if (pos < 0).any():
        t = int(np.argmax(pos < 0))
        raise InputError(f"{where}: positions: token {t}: value {int(pos[t])} is negative")
    bad = (topk < -1) | (topk >= P)
    if bad.any():
        l, t, s = (int(x) for x in np.argwhere(bad)[0])
        raise InputError(f"{where}: topk_ids_of_layer: layer {l} token {t} slot {s}: physical id "
                         f"{int(topk[l, t, s])} out of range [0, {P}) (-1 = none)")
    seq_lens = None
    if rec.get("extend_seq_lens") is not None:
        seq_lens = _int_array(rec["extend_seq_lens"], f"{where}: extend_seq_lens", 1)
        if (seq_lens < 0).any() or int(seq_lens.sum()) != T:
            raise InputError(f"{where}: extend_seq_lens: {seq_lens.tolist()[:8]} does not sum to "
                             f"the record's {T} tokens")
    rank = rec.get("rank")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise InputError(f"{where}: rank: {rank!r} is not a non-negative integer")
    # SGLang writes forward_mode as ForwardMode.value and forward_pass_id as an int; anything
    # else (a tensor) would make the decode test or the de-duplication key meaningless
    for key in ("forward_mode", "forward_pass_id"):
        v = rec.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise InputError(f"{where}: {key}: {type(v).__name__} is not an integer")
    return Record(ids, pos, topk, seq_lens, rec.get("forward_pass_id"),
                   rec.get("forward_mode"), rank)


def request_starts(positions: np.ndarray, seq_lens: np.ndarray | None = None,
                   forward_mode: Any = None) -> np.ndarray:
    """bool[T]: True where a request starts inside one record (see the module docstring)."""
    T = positions.shape[0]
    start = np.zeros(T, bool)
    if T == 0:
        return start
    if forward_mode == DECODE_MODE:
        start[:] = True
        return start
    if seq_lens is not None:
        offs = np.cumsum(seq_lens)[:-1]
        start[0] = True
        start[offs[offs < T]] = True
        return start
    start[0] = True
    start[1:] = positions[1:] != positions[:-1] + 1
    return start


@dataclass
class FileInfo:
    path: Path
    rank: int | None
    L: int
    P: int
    map_max: int
    active: np.ndarray                     # bool[L]
    slots: int                             # leading slots used in any layer
    max_token: int
    records: int
    keys: list[bytes | None] = field(default_factory=list)  # per record; None = empty
    modes: list[tuple[str, int]] = field(default_factory=list)  # per record: forward_mode, T


def logical_ids(topk: np.ndarray, pmap: np.ndarray) -> np.ndarray:
    """int64[L, T, K] logical ids (-1 stays -1)."""
    L = topk.shape[0]
    rows = np.arange(L)[:, None, None]
    return np.where(topk >= 0, pmap[rows, np.clip(topk, 0, None)], -1)


def scan_dump(path: Path) -> FileInfo:
    obj = load_dump(path)
    pmap = dump_map(obj, path)
    L, P = pmap.shape
    info = FileInfo(path, None, L, P, int(pmap.max()), np.zeros(L, bool), 0, -1,
                     len(obj["records"]))
    ranks = set()
    top = obj.get("rank")
    for i, raw in enumerate(obj["records"]):
        r = read_record(raw, i, path, L, P)
        if r.rank is not None:
            ranks.add(r.rank)
        T = r.input_ids.shape[0]
        info.modes.append((str(r.forward_mode), T))
        if T == 0:
            info.keys.append(None)
            continue
        used = r.topk >= 0
        info.active |= used.any(axis=(1, 2))
        cols = np.flatnonzero(used.any(axis=(0, 1)))
        if cols.size:
            info.slots = max(info.slots, int(cols[-1]) + 1)
        info.max_token = max(info.max_token, int(r.input_ids.max()))
        h = hashlib.sha1()
        for a in (r.input_ids, r.positions, logical_ids(r.topk, pmap)):
            h.update(np.ascontiguousarray(a, np.int64).tobytes())
            h.update(b"|")
        info.keys.append(repr(r.forward_pass_id).encode() + b"/" + h.digest())
    if isinstance(top, int) and not isinstance(top, bool):
        ranks.add(top)
    if len(ranks) > 1:
        raise InputError(f"{path}: records of several ranks {sorted(ranks)} in one file")
    if ranks:
        info.rank = ranks.pop()
    else:
        m = _RANK_RE.search(path.name)
        info.rank = int(m.group(1)) if m else None
    return info
