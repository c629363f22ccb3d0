"""Online data scheduling: request schedulers (Attention-DP) and token re-batching (Attention-TP)."""

# The load-aware request policies register themselves in `requests.REQUEST_POLICIES`; importing
# them here makes the registry complete whichever schedule module is imported first.
from sempar.schedule import load_policies as _load_policies  # noqa: F401
