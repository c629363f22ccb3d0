"""Serving forecasts: a discrete-event simulator of MoE serving under expert parallelism
(`sempar serve-sim`) and a deployment planner (`sempar plan`).

Data flow: trace -> placement / schedulers (placement, schedule) -> per-iteration communication
from sempar.comm on the iterations' real routing (steptable) + compute from a roofline of the
accelerator (roofline, dims, hardware) -> the event loop (engine, workload) -> metrics and SLOs
(metrics) -> systems side by side (systems, forecast) -> plan.
"""
