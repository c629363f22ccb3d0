"""`sempar`, our placement solver, as a package: importing it registers `sempar` in `SOLVERS`.

Modules: `solver` (the entry point and the tp / dp alternations), `tokens` (the tp token step),
`experts` (the expert step), `load` (the load model behind the balance cap), `replicas` (the
replica step), `scale` (the large-trace path's bounds and samplers), `_pool` (forked per-layer
workers). Nothing outside the package imports those modules; it uses `solve("sempar", ...)`.
"""

from sempar.placement.sempar import solver  # noqa: F401  (registers "sempar")
