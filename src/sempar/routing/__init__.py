"""Cost-aware routing (CAMoE §3.4): gate-bias tables from a topology and one-shot traffic
accounting, a hook that applies them to HF MoE routers, the lambda controller, and the sweep."""

from sempar.routing.cost_bias import (CostBiasTables, TokenBytes, a2a_layer_seconds,  # noqa: F401
                                      build_tables, destination_table, dispatch_counts,
                                      traffic_weighted_cost, unit_bias,
                                      zscore_row)
from sempar.routing.hook import CostRoutingHook, supported_model_types  # noqa: F401
from sempar.routing.report import pareto_plot  # noqa: F401,E402
from sempar.routing.sweep import SweepConfig, run_sweeps  # noqa: F401,E402
