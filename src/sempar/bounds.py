"""Numbers from the user are finite and within sane bounds before any work starts.

Every numeric option of every verb is declared with a bound from here (`bound` for one number,
`NumberList` for a comma-separated list), so a NaN time limit, a negative seed or a size that
would hang the machine (`--redundant 80000000`) is one line and exit 2 instead of a hang, a
MemoryError or a run that never stops. The callbacks carry their `Bounds` so the tests find every
bounded option from the typer app itself (tests/cli/test_hostile_options.py). The bounds are not
physical limits; they are far beyond any real model or cluster (DeepSeek-V3: 256 experts, 61
layers; the largest EP deployments: a few hundred devices) and far below what exhausts memory.
Where two options multiply into the work (requests = rate x duration), the product is bounded
too, before the work starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

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
# serving forecasts (serve-sim, plan): the discrete-event simulator holds O(1) numbers per
# request and steps one iteration per batch. Measured (serve-sim, tiny-moe64, sglang, 2000 req/s x
# 50 s, one shared core): 100k requests in 40 s and ~100 MB over the 460 MB baseline. So 200k
# requests per rate point (60 s at 3,300 req/s, beyond the papers' sweeps) is ~1.5 minutes and
# ~200 MB a point; `--duration 1e7` or `--rates 1e12` (7 TiB asked for) is refused up front.
RATE_MAX = 1e6                  # requests/s of one rate point
REQUESTS_MAX = 200_000          # rate x duration: requests simulated per rate point
REQUEST_TOKENS_MAX = 131_072    # --input-len / --output-len: a 128k context
BUDGET_MAX = 1 << 20            # --token-budget: tokens per iteration per device (step table
#                                 bins are log2 of it; 2^63 overflows numpy's log2)
RUNNING_MAX = 65_536            # --max-running: requests in flight per device
# stream (FSE-DP): the flow simulator's cost per iteration grows about as micro-slices^3
# (measured, fsedp, qwen3-30b-a3b, 64 tokens/iter, shared cores: ~0 s at 32, 0.6 s at 64, 3.5 s
# at 128, ~35 s at 256), and seven strategies run it; `--micro-slices 4096` never finished. The
# work is bounded as iterations x micro-slices^3 <= that of the default phi-3.5-moe run (100
# iterations at the 64 slices auto_micro_slices picks for it: minutes), the count itself to 256.
MICRO_SLICES_MAX = 256
MICRO_SLICE_WORK_MAX = 100 * 64**3
SCALE_MAX = 1e6                 # --slo-scale: SLO = scale x the lightest-load latency
# `export --to sglang` writes one row of physical slots per hidden layer (dense ones included):
# num_hidden_layers x slots entries of JSON, ~7 bytes each. DeepSeek-V3 (61 layers, 256 experts
# + 32 redundant slots) is 17,568; the bound is 2^24 (~120 MB of JSON, which SGLang loads into a
# dense tensor at start-up), so a placement claiming 10,000 layers of 10^6 slots (70 GB) is
# refused before a row is built.
SGLANG_MAP_ENTRIES_MAX = 1 << 24


def token_ids(value: Any, what: str, error: type[Exception] = InputError) -> list[int]:
    """`value` when it is a list of token ids (JSON integers in [0, VOCAB_MAX): int32 with
    room), else `error` naming `what`. A JSON boolean is not an id (Python's True is an int),
    and an id of 2^32 + 5 is refused rather than stored as 5 by a narrowing cast."""
    if not isinstance(value, list) or not all(
            type(t) is int and 0 <= t < VOCAB_MAX for t in value):
        bad = next((t for t in value if not (type(t) is int and 0 <= t < VOCAB_MAX)), None) \
            if isinstance(value, list) else value
        raise error(f"{what}: not a list of token ids (integers in [0, {VOCAB_MAX}); found "
                    f"{str(bad)[:40]})")
    return value


@dataclass(frozen=True)
class Bounds:
    """What a bounded option accepts: lo <= v <= hi (open ends strict), integers only with
    `integer`; `words` are non-numeric tokens a list also accepts (e.g. "G")."""
    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    words: tuple[str, ...] = ()


def _num(x: float) -> str:
    """A bound as the user would type it: 1048576, not 1.04858e+06."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def check_bound(option: str, value: Any, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> Any:
    """`value` if it is finite and lo <= value <= hi (lo < value with `lo_open`, value < hi with
    `hi_open`); else InputError."""
    if value is None:
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{option}: {value} is not a finite number")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise InputError(f"{option}: {value} must be {'above' if lo_open else 'at least'} {_num(lo)}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise InputError(f"{option}: {value} must be below {_num(hi)}" if hi_open
                         else f"{option}: {value} is above the limit {_num(hi)}")
    return value


def _name(param: Any) -> str:
    return max(param.opts, key=len) if getattr(param, "opts", None) else param.name


def bound(lo: float | None = None, hi: float | None = None,
          lo_open: bool = False, hi_open: bool = False) -> Callable[..., Any]:
    """A typer option callback applying `check_bound` under the option's own name; its `bounds`
    attribute says what it accepts."""
    def callback(param: typer.CallbackParam, value: Any) -> Any:
        name = _name(param)
        if isinstance(value, (list, tuple)):
            return type(value)(check_bound(name, v, lo, hi, lo_open, hi_open) for v in value)
        return check_bound(name, value, lo, hi, lo_open, hi_open)

    callback.bounds = Bounds(lo, hi, lo_open, hi_open)     # type: ignore[attr-defined]
    return callback


@dataclass(frozen=True)
class NumberList:
    """A comma-separated list of numbers given as one option (`--rates 1,2,5`, `--ep 4,8`), each
    within `bounds`: `parse` reads it, `callback` checks it when the command line is parsed."""
    option: str
    bounds: Bounds
    max_items: int = 100        # each value is a run (a rate point, a lambda pass, an EP size)

    def parse(self, text: Optional[str]) -> Optional[list]:
        """The values (ints with `integer`; a word of `bounds.words` kept as is), None for None."""
        if text is None:
            return None
        b, out = self.bounds, []
        for part in (p.strip() for p in str(text).split(",")):
            if not part:
                continue
            if part in b.words:
                out.append(part)
                continue
            try:
                v: Any = int(part) if b.integer else float(part)
            except ValueError:
                kind = "an integer" if b.integer else "a number"
                extra = f" or {' / '.join(b.words)}" if b.words else ""
                raise InputError(f"{self.option}: {part!r} is not {kind}{extra}") from None
            out.append(check_bound(self.option, v, b.lo, b.hi, b.lo_open, b.hi_open))
        if not out:
            raise InputError(f"{self.option}: {text!r} lists no value")
        if len(out) > self.max_items:
            raise InputError(f"{self.option}: {len(out)} values; at most {self.max_items}")
        return out

    @property
    def callback(self) -> Callable[..., Any]:
        def check(value: Optional[str]) -> Optional[str]:
            self.parse(value)
            return value

        check.bounds = self.bounds                           # type: ignore[attr-defined]
        check.number_list = self                             # type: ignore[attr-defined]
        return check


SEED = bound(0, SEED_MAX)
DEVICES = bound(1, DEVICES_MAX)
HOSTS = bound(2, HOSTS_MAX)
POSITIVE_SECONDS = bound(0, SECONDS_MAX, lo_open=True)
CHUNK_SLACK = bound(0.0, 1.0, hi_open=True)     # tp chunks up to (1 + eps) x batch / G


def check_requests(rates: list[float], duration: float, what: str = "--rates x --duration") -> None:
    """Refuse a sweep whose largest rate point simulates more than REQUESTS_MAX requests."""
    n = max(rates) * duration
    if not n <= REQUESTS_MAX:
        raise InputError(f"{what}: {max(rates):g} req/s x {duration:g} s = {n:.3g} requests per "
                         f"rate point is above the limit {REQUESTS_MAX}")


def check_micro_slice_work(iterations: int, micro_slices: int, option: str = "--iterations") -> None:
    """Refuse a flow simulation of more than MICRO_SLICE_WORK_MAX iterations x micro-slices^3."""
    work = iterations * micro_slices**3
    if work > MICRO_SLICE_WORK_MAX:
        most = MICRO_SLICE_WORK_MAX // micro_slices**3
        raise InputError(f"{option} x --micro-slices^3: {iterations} x {micro_slices}^3 = {work} is "
                         f"above the limit {MICRO_SLICE_WORK_MAX} (" + (
                             f"at most {most} iteration{'s' * (most > 1)} at {micro_slices} micro-slices)" if most
                             else f"{micro_slices} micro-slices is too many for one iteration)"))
