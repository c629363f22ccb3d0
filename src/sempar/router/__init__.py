"""`sempar router`: an expert-aware request router in front of an engine's data-parallel ranks.

Data flow: a client's OpenAI-style request -> `prompt` (the model's tokenizer and chat template)
-> a request policy of `schedule.requests.REQUEST_POLICIES` (the one `evaluate --mode dp --online`
and `serve-sim` run; `policies` lists the router's) -> `engines` (the rank in the field or header
the engine reads) -> `upstream` (async HTTP, streamed through) -> the client. `app` builds the
ASGI app, `serve` runs it under uvicorn; `metrics` holds the Prometheus series.
"""
