"""Requests for the serving loop: arrival times, input / output lengths and the trace request
each one replays (whose tokens decide its Attention-DP rank under the system's request policy).

Arrivals: Poisson at `rate` requests/s over `duration` s (`stable_arrivals`: one unit-rate stream
scaled by the rate, the same for every rate), or times read from a file (one number
of seconds per line, or a JSON list). Lengths (`lengths`):

- `fixed`: every request `input_len` in and `output_len` out (Sem-MoE §5 fixes both);
- `trace`: input = the replayed trace request's token count, output = `output_len`;
- `exp`: exponential with means `input_len` and `output_len`, at least 1 token (a distribution
  for users without their own; ours).

Simulated request i replays request i mod R of the simulated split, in the split's order, so
the rank the policy gave that request on the split (comm.homes) is the one it gets here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sempar.errors import InputError
from sempar.safe_json import parse_json
from sempar.serving.engine import Workload

LENGTHS = ("fixed", "trace", "exp")


@dataclass(frozen=True, eq=False)
class WorkloadSpec:
    """What a forecast serves (`serve-sim` and `plan`, one object instead of seven arguments):
    `rates` requests/s to sweep (None: `n_rates` default rates up to 1.2x the estimated
    capacity, forecast.default_rates), each for `duration` s of arrivals; or `arrivals`
    float64[R] (s) read from a file, one point instead of the rates (`compare` only); request
    lengths by `lengths` with means or fixed values `input_len` / `output_len` (LENGTHS)."""

    rates: tuple[float, ...] | None = None
    duration: float = 60.0
    lengths: str = "fixed"
    input_len: int = 512
    output_len: int = 128
    n_rates: int = 10
    arrivals: np.ndarray | None = None

    @property
    def io(self) -> tuple[str, int, int]:
        """(lengths, input_len, output_len): what Forecaster.run_rate and `served` take."""
        return (self.lengths, self.input_len, self.output_len)


def poisson_arrivals(rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    """float64[R]: sorted arrival times of a Poisson process of `rate` on [0, duration)."""
    if rate <= 0 or duration <= 0:
        raise InputError(f"rate {rate} and duration {duration} must be positive")
    n = rng.poisson(rate * duration)
    return np.sort(rng.uniform(0.0, duration, n))


ARRIVAL_BLOCK = 4096     # gaps drawn per block: a fixed size, so the stream is one prefix for all rates


def stable_arrivals(rate: float, duration: float, seed) -> np.ndarray:
    """float64[R]: a Poisson process of `rate` on [0, duration) as one unit-rate process (drawn
    from `seed`) scaled by 1 / rate, so every rate sees the same arrivals compressed or
    stretched (common random numbers: a search on the rate compares like with like, and the
    SLO statistics do not jump with a new draw at every rate)."""
    if not (rate > 0 and duration > 0):
        raise InputError(f"rate {rate} and duration {duration} must be positive")
    rng = np.random.default_rng(seed)
    end, parts, t = rate * duration, [], 0.0
    while t < end:
        gaps = np.cumsum(rng.standard_exponential(ARRIVAL_BLOCK)) + t
        parts.append(gaps)
        t = float(gaps[-1])
    unit = np.concatenate(parts)
    return unit[unit < end] / rate


def read_arrivals(path: str | Path) -> np.ndarray:
    """Arrival times in seconds from a text file (one per line) or a JSON list; sorted. Each time
    is finite, >= 0 and at most `bounds.SECONDS_MAX` (a week: an enormous one overflowed in the
    engine); the file at most `JSON_BYTES_MAX` bytes."""
    from sempar.atomic import check_input
    from sempar.bounds import JSON_BYTES_MAX, SECONDS_MAX

    p = check_input(path, "--arrivals file")
    if p.stat().st_size > JSON_BYTES_MAX:
        raise InputError(f"--arrivals: {p} is above the limit of {JSON_BYTES_MAX} bytes")
    text = p.read_text(errors="replace")
    try:
        vals = parse_json(text, f"--arrivals: {p}") if text.lstrip().startswith("[") \
            else [float(x) for x in text.split()]
        if isinstance(vals, list) and any(isinstance(v, bool) for v in vals):
            raise TypeError("a boolean")
        a = np.asarray(vals, np.float64)
    except (ValueError, TypeError):
        raise InputError(f"--arrivals: {p} holds something that is not a number") from None
    if a.ndim != 1 or a.size == 0 or not np.isfinite(a).all() or (a < 0).any() or \
            (a > SECONDS_MAX).any():
        raise InputError(f"--arrivals: {p} must list finite seconds in [0, {SECONDS_MAX:g}]")
    return np.sort(a - a.min())


def make_workload(arrival: np.ndarray, lengths: str, input_len: int, output_len: int,
                  request_tokens: np.ndarray, request_rank: np.ndarray,
                  rng: np.random.Generator) -> Workload:
    """request_tokens int[Rt], request_rank int[Rt]: the trace's requests (token counts, ranks)."""
    if lengths not in LENGTHS:
        raise InputError(f"--lengths: {lengths!r} is not one of {', '.join(LENGTHS)}")
    if input_len < 1 or output_len < 1:
        raise InputError("--input-len and --output-len must be at least 1")
    R = arrival.size
    j = np.arange(R) % request_tokens.size
    if lengths == "fixed":
        inp, out = np.full(R, input_len), np.full(R, output_len)
    elif lengths == "trace":
        inp, out = request_tokens[j], np.full(R, output_len)
    else:
        inp = np.maximum(1, np.ceil(rng.exponential(input_len, R)))
        out = np.maximum(1, np.ceil(rng.exponential(output_len, R)))
    return Workload(arrival, np.asarray(inp, np.int64), np.asarray(out, np.int64),
                    np.asarray(request_rank[j], np.int32))
