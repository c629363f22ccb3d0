"""`RouterMetrics`: the router's Prometheus series, in a registry of their own (one per app).

sempar_router_requests_total{rank}            requests routed to each rank
sempar_router_inflight_requests{rank}         requests each rank holds now
sempar_router_inflight_tokens{rank}           prompt tokens each rank holds now (the load term)
sempar_router_predicted_local_share           histogram: the chosen rank's share of the request's
                                              token-table votes (the predicted local activations)
sempar_router_upstream_seconds{stage}         histogram: upstream latency, stage = first_byte | total
sempar_router_errors_total{kind}              bad_json, too_large, no_prompt, unauthorized,
                                              not_found, overloaded, upstream_down,
                                              upstream_timeout, client_gone
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ERROR_KINDS = ("bad_json", "too_large", "no_prompt", "unauthorized", "not_found", "overloaded",
               "upstream_down", "upstream_timeout", "client_gone")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                   60, 120, 300)


class RouterMetrics:
    """The series above for `dp_size` ranks; `render()` is the /metrics body (bytes)."""

    def __init__(self, dp_size: int):
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("sempar_router_requests", "requests routed, per rank", ["rank"],
                                registry=r)
        self.inflight_requests = Gauge("sempar_router_inflight_requests",
                                       "requests in flight, per rank", ["rank"], registry=r)
        self.inflight_tokens = Gauge("sempar_router_inflight_tokens",
                                     "prompt tokens in flight, per rank", ["rank"], registry=r)
        self.local_share = Histogram("sempar_router_predicted_local_share",
                                     "chosen rank's share of the request's token-table votes",
                                     buckets=tuple(i / 10 for i in range(1, 11)), registry=r)
        self.upstream = Histogram("sempar_router_upstream_seconds", "upstream latency",
                                  ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.errors = Counter("sempar_router_errors", "errors by kind", ["kind"], registry=r)
        # children resolved once: label lookups cost more than the increments themselves
        ranks = [str(g) for g in range(dp_size)]
        self.by_rank = [(self.requests.labels(g), self.inflight_requests.labels(g),
                         self.inflight_tokens.labels(g)) for g in ranks]
        self.first_byte = self.upstream.labels("first_byte")
        self.total = self.upstream.labels("total")
        for k in ERROR_KINDS:
            self.errors.labels(k)

    def render(self) -> bytes:
        return generate_latest(self.registry)
