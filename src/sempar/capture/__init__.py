"""Capture routing from serving engines: SGLang's and vLLM's per-token routed experts, returned
with each response, decoded (`payload`), requested over HTTP (`client`, `engines`) and streamed
into a trace (`job`), or read from responses a user's own client saved (`responses`)."""
