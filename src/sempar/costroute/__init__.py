"""Cost-aware routing (CAMoE §3.4): gate-bias tables from a topology and one-shot traffic
accounting, a hook that applies them to HF MoE routers, the lambda controller, and the sweep."""

from sempar.costroute.cost_bias import (CostBiasTables, TokenBytes, a2a_layer_seconds,  # noqa: F401
                                      build_tables, destination_table, dispatch_counts,
                                      traffic_weighted_cost, unit_bias,
                                      zscore_row)
from sempar.costroute.hook import CostRoutingHook, supported_model_types  # noqa: F401
from sempar.costroute.report import pareto_plot  # noqa: F401,E402
from sempar.costroute.sweep import SweepConfig, run_sweeps  # noqa: F401,E402
