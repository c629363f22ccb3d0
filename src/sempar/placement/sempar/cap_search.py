"""The held-out cap search (`held_out.calibrated_solve`, steps 4 and 6): which fit cap to solve
at next, from the (cap, placement, bootstrap, point, upper) tuples tried so far, and which one
to keep. Ours (issue 45); the module docstring of held_out.py gives the measurements."""

from __future__ import annotations

from typing import Callable

SECANT_GUARD = 0.1   # the secant step stays this share of the bracket inside its ends


def search_cap(tried: list, at: Callable[[float], tuple], key: int, aim: float,
               retries: int, floor: float) -> None:
    """The cap search (`held_out.calibrated_solve`, steps 4 and 6) on the prediction t[key] of
    each tried (cap, placement, bootstrap, point, upper) t, appending to `tried`: while no cap is
    within `aim`, the lowest cap tried less its excess (at least `floor`); then, between the
    highest cap within and the lowest cap above it that is not, the cap where the straight line
    through their two predictions meets `aim` (regula falsi; kept `SECANT_GUARD` of the bracket
    inside its ends, so a flat end cannot stall it); `retries` solves at most, none twice at
    the same cap.

    The secant step replaced bisection (issue 45, h45s): the prediction is close to linear in
    the cap across a bracket of a hundredth (DeepSeek-V2-Lite EP 8 dp, point prediction at fit
    caps 0.987 / 0.990 / 0.9935: 1.0849 / 1.0869 / 1.0922), so halving the bracket spends the
    last solve where the line already says the aim is crossed: there the bracket (0.987:
    1.0835, 1.0: 1.103) was halved to 0.9935 (1.0949, above 1.09) and 0.987 kept, 0.0065 under
    the aim; the secant probes 0.991."""
    for _ in range(retries):
        good = max((t for t in tried if t[key] <= aim), key=lambda t: t[0], default=None)
        bad = min((t for t in tried if t[key] > aim and (good is None or t[0] > good[0])),
                  key=lambda t: t[0], default=None)
        if bad is None:
            return
        if good is None:
            cap = max(floor, bad[0] - (bad[key] - aim))
        else:
            frac = (aim - good[key]) / max(bad[key] - good[key], 1e-12)   # in [0, 1)
            frac = min(max(frac, SECANT_GUARD), 1.0 - SECANT_GUARD)
            cap = good[0] + frac * (bad[0] - good[0])
        if any(abs(cap - t[0]) < 1e-4 for t in tried):
            return                          # the floor already tried and still too loose
        tried.append(at(cap))


def kept_cap(tried: list, key: int, aim: float) -> tuple:
    """(cap, placement, bootstrap, point, upper) kept: the highest cap whose t[key] is within
    `aim`; else the lowest t[key]."""
    good = [t for t in tried if t[key] <= aim]
    return max(good, key=lambda t: t[0]) if good else min(tried, key=lambda t: t[key])
