"""sempar: semantic parallelism for Mixture-of-Experts inference.

The data flows one way (see docs/design.md): trace -> affinity -> placement -> schedulers ->
simulate or run -> report.
"""

__version__ = "0.1.0"
