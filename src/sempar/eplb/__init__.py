"""sempar inside the engines' own balancer (design.md, "Engine balancer"): an EPLB policy that
keeps the locality learned from a sempar FILE and balances the engine's live load window.

- `config.PluginConfig`: the knobs, read from the environment (`SEMPAR_EPLB*`);
- `source`: reads FILE (a placement JSON or a `sempar stats build` file) and checks it fits the
  engine's model shape;
- `policy.rebalance`: the engine-free policy core (numpy only);
- `engine`: what both engines' glue shares (FILE cache, fallback, log line, metrics);
- `vllm_plugin` / `sglang_plugin`: the entry points named `sempar` (docs/eplb-plugin.md).

Importing this package imports neither engine; the plug-ins do nothing unless SEMPAR_EPLB is set.
"""
