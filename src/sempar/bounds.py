"""Numbers from the user are finite and within sane bounds before any work starts.

Every numeric option of every verb names its bound here or at its definition, so a NaN time
limit, a negative seed or a size that would hang the machine (`--redundant 80000000`) is one
line and exit 2 instead of a hang, a MemoryError or a run that never stops. The bounds are not
physical limits; they are far beyond any real model or cluster (DeepSeek-V3: 256 experts, 61
layers; the largest EP deployments: a few hundred devices) and far below what exhausts memory.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import typer

from sempar.errors import InputError

SEED_MAX = 2**32 - 1            # numpy's legacy seeding and torch accept this range
DEVICES_MAX = 4096              # EP degree / devices / ranks / nodes of a simulated cluster
HOSTS_MAX = 64                  # ranks of a live run: one process (and netns host) each
REDUNDANT_MAX = 4096            # replica slots per layer
TOKENS_MAX = 2**31 - 1          # rows of a trace (int32 request and token ids)
LAYERS_MAX = 10_000
SECONDS_MAX = 7 * 24 * 3600.0   # time limits and TTLs: a week
EXPERTS_MAX = 1 << 20           # logical experts of a model (DeepSeek-V3: 256)
VOCAB_MAX = 2**31 - 1           # int32 token ids
# User JSON (safe_json.py): nesting far beyond any file sempar writes (a placement is 4 deep)
# and far below Python's recursive parser's limit; sizes checked before a file is read.
JSON_DEPTH_MAX = 64
JSON_BYTES_MAX = 64 << 20                   # topologies, configs, indexes, metadata blocks
PLACEMENT_JSON_BYTES_MAX = 2 << 30          # a placement with a 129k-vocabulary token table


def check_bound(option: str, value: Any, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> Any:
    """`value` if it is finite and lo <= value <= hi (lo < value with `lo_open`, value < hi with
    `hi_open`); else InputError."""
    if value is None:
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{option}: {value} is not a finite number")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise InputError(f"{option}: {value} must be {'above' if lo_open else 'at least'} {lo:g}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise InputError(f"{option}: {value} must be below {hi:g}" if hi_open
                         else f"{option}: {value} is above the limit {hi:g}")
    return value


def bound(lo: float | None = None, hi: float | None = None,
          lo_open: bool = False, hi_open: bool = False) -> Callable[..., Any]:
    """A typer option callback applying `check_bound` under the option's own name."""
    def callback(param: typer.CallbackParam, value: Any) -> Any:
        name = max(param.opts, key=len) if param.opts else param.name
        if isinstance(value, (list, tuple)):
            return type(value)(check_bound(name, v, lo, hi, lo_open, hi_open) for v in value)
        return check_bound(name, value, lo, hi, lo_open, hi_open)

    return callback


SEED = bound(0, SEED_MAX)
DEVICES = bound(1, DEVICES_MAX)
HOSTS = bound(2, HOSTS_MAX)
POSITIVE_SECONDS = bound(0, SECONDS_MAX, lo_open=True)
CHUNK_SLACK = bound(0.0, 1.0, hi_open=True)     # tp chunks up to (1 + eps) x batch / G
