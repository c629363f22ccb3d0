"""`sempar`, our placement solver, as a package: importing it registers `sempar` in `SOLVERS`.

Modules: `config` (`SemparConfig`, every tuning setting), `solver` (the entry points and the
tp / dp alternations), `tokens` (the tp token step), `experts` (the expert step), `load` (the
load model behind the balance cap), `replicas` (the replica step), `scale` (the large-trace
path's bounds and samplers), `_pool` (forked per-layer workers). Outside the package, code
solves by name (`solve("sempar", ...)`, the default config) or, to choose the settings, with
`sempar_solve(problem, config)`; benchmarks record `dataclasses.asdict(SemparConfig...)`.
"""

from sempar.placement.sempar.config import SemparConfig
from sempar.placement.sempar.solver import sempar_solve  # (importing it registers "sempar")

__all__ = ["SemparConfig", "sempar_solve"]
