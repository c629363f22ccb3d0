"""Online data scheduling: request schedulers (Attention-DP) and token re-batching (Attention-TP)."""
