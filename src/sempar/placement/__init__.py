"""Offline model scheduling: the `Placement` type and every solver behind one `solve()`."""

from sempar.placement import cem, eplb, graph_baselines, ilp, moetuner, oracle, semmoe, sempar, simple  # noqa: F401  (each module registers its solvers)
from sempar.placement import exact  # noqa: F401  (`sempar-exact`, after `sempar`)
from sempar.placement.base import SOLVERS, PlacementProblem, solve
from sempar.solve_options import SolveOptions
from sempar.placement.placement import Placement, contiguous_nodes

__all__ = ["SOLVERS", "Placement", "PlacementProblem", "SolveOptions", "contiguous_nodes",
           "solve"]
