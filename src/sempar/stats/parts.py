"""The optional parts of `RoutingStats` (stats/routing_stats.py), registered once by name with
what each holds, whether it needs token ids and whether it is built by default. A light module
(no numpy): the CLI lists the parts in its help without importing the statistics code."""

from __future__ import annotations

from dataclasses import dataclass

from sempar.registry import Registry


@dataclass(frozen=True)
class StatsPart:
    """One optional part of `RoutingStats`: what it holds, whether it needs token ids, and
    whether `sempar stats build` makes it by default."""

    name: str
    holds: str
    needs_token_ids: bool = False
    default: bool = False


STATS_PARTS: Registry[StatsPart] = Registry("stats part")
for _part in (StatsPart("sample", "a seeded sample of whole requests (the rows objective's fit)",
                        default=True),
              StatsPart("tokens", "per-layer token x expert counts (token tables)",
                        needs_token_ids=True, default=True),
              StatsPart("coactivation", "per-layer expert co-activation counts [L, N, N]"),
              StatsPart("transitions", "layer l -> l+1 expert transition counts [L-1, N, N]"),
              StatsPart("request-experts", "per-layer request x expert counts (dp mode)")):
    STATS_PARTS.add(_part.name, _part)
PARTS = tuple(STATS_PARTS.names())
DEFAULT_PARTS = tuple(n for n in PARTS if STATS_PARTS.get(n).default)
