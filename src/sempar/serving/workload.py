"""Requests for the serving loop: arrival times, input / output lengths and the trace request
each one replays (whose tokens decide its Attention-DP rank under the system's request policy).

Arrivals: Poisson at `rate` requests/s over `duration` s, or times read from a file (one number
of seconds per line, or a JSON list). Lengths (`lengths`):

- `fixed`: every request `input_len` in and `output_len` out (Sem-MoE §5 fixes both);
- `trace`: input = the replayed trace request's token count, output = `output_len`;
- `exp`: exponential with means `input_len` and `output_len`, at least 1 token (a distribution
  for users without their own; ours).

Simulated request i replays request i mod R of the simulated split, in the split's order, so
the rank the policy gave that request on the split (comm.homes) is the one it gets here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sempar.errors import InputError
from sempar.safe_json import parse_json
from sempar.serving.engine import Workload

LENGTHS = ("fixed", "trace", "exp")


def poisson_arrivals(rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    """float64[R]: sorted arrival times of a Poisson process of `rate` on [0, duration)."""
    if rate <= 0 or duration <= 0:
        raise InputError(f"rate {rate} and duration {duration} must be positive")
    n = rng.poisson(rate * duration)
    return np.sort(rng.uniform(0.0, duration, n))


def read_arrivals(path: str | Path) -> np.ndarray:
    """Arrival times in seconds from a text file (one per line) or a JSON list; sorted."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--arrivals: {p} is not a file")
    text = p.read_text(errors="replace")
    try:
        vals = parse_json(text, f"--arrivals: {p}") if text.lstrip().startswith("[") \
            else [float(x) for x in text.split()]
        a = np.asarray(vals, np.float64)
    except (ValueError, TypeError):
        raise InputError(f"--arrivals: {p} holds something that is not a number") from None
    if a.ndim != 1 or a.size == 0 or not np.isfinite(a).all() or (a < 0).any():
        raise InputError(f"--arrivals: {p} must list non-negative finite seconds")
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
