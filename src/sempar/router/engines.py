"""How each engine takes an external choice of data-parallel rank, registered by name.

- SGLang 0.5.23: the OpenAI endpoints read the `X-Data-Parallel-Rank` header
  (`srt/entrypoints/openai/serving_base.py`, `extract_routed_dp_rank_from_header`, above the
  body's `routed_dp_rank`); `/generate` reads `routed_dp_rank` in its body (`GenerateReqInput`).
- vLLM 0.33.0: the `X-data-parallel-rank` header (`entrypoints/generate/base/serving.py`,
  `_get_data_parallel_rank`), on its OpenAI endpoints; it has no `/generate`.
Checked against the engines' own code in tests/router/test_router_engines.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from sempar.registry import Registry


@dataclass(frozen=True)
class EngineRank:
    """header: the rank header of the OpenAI routes; body_field: the body field of the native
    `/generate` route, or None when the engine has none; native_policy: the engine's own
    request placement, as `sempar plan` names it."""

    header: str
    body_field: str | None
    native_policy: str

    @property
    def routes(self) -> tuple[str, ...]:
        base = ("/v1/chat/completions", "/v1/completions")
        return base + (("/generate",) if self.body_field else ())


ENGINES: Registry[EngineRank] = Registry("engine")
ENGINES.add("sglang", EngineRank("X-Data-Parallel-Rank", "routed_dp_rank", "round-robin"))
ENGINES.add("vllm", EngineRank("X-data-parallel-rank", None, "least-inflight"))
