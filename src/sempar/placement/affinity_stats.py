"""Alias of `sempar.affinity.routing_stats.AffinityStats` for modules that import it from here."""

from sempar.affinity.routing_stats import AffinityStats

__all__ = ["AffinityStats"]
