"""Routing traces: schema, Parquet I/O, validation, operations and the synthetic generator."""

from sempar.trace.io import TraceWriter, read_header, read_trace, trace_info, write_trace
from sempar.trace.ops import concat, select_domains, split_by_request, split_by_token
from sempar.trace.schema import FORMAT_VERSION, RoutingTrace, TraceMeta

__all__ = ["FORMAT_VERSION", "RoutingTrace", "TraceMeta", "TraceWriter", "concat", "read_header",
           "read_trace", "select_domains", "split_by_request", "split_by_token", "trace_info",
           "write_trace"]
