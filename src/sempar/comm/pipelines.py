"""Pipelines: the collectives of one MoE layer, per docs/design.md (Vocabulary, Pipelines).

| name | attention | per MoE layer | home of a token | dedup | metadata |
| --- | --- | --- | --- | --- | --- |
| `ds-moe` | TP | AR -> A2A dispatch -> A2A combine -> AG (s-MoE §3.2) | contiguous chunk of the batch | no | separate |
| `sglang-tp` | TP | AR (attention) + AR (expert TP) (s-MoE's SGLang baseline) | - (no EP) | - | - |
| `smoe` = `semmoe-tp` | TP | shuffled RS -> A2A -> A2A -> shuffled AG | re-batched chunk (schedulers) | yes | one-shot |
| `smoe-exact` | TP | AR of [T, N] logits -> shuffled RS -> A2A -> A2A -> shuffled AG | capacity-aligned home of the pre-routed experts (`schedule.prerouter`) | yes | one-shot |
| `attn-dp` | DP | A2A dispatch -> A2A combine | DP rank of the request | no | separate |
| `sglang-ep` | DP | one-shot dispatch (DeepEP) -> combine | DP rank of the request | yes | one-shot |
| `exflow` | DP, context-coherent | one A2A dispatch per layer (+ partial combine for k > 1); one AG of the new tokens per batch | layer 0: DP rank; then the device of its top-1 expert | no | separate |
| `exflow-prefill` | DP, context-coherent | AG of the held context -> A2A dispatch -> partial combine, every layer | as `exflow` | yes | one-shot (+ token index) |

Choices where the papers are vague (ours):

- `smoe` counts the shuffled all-gather that closes every layer (s-MoE Alg. 2 runs it: "After
  MoE computing is complete, s-MoE runs the allgather"), although s-MoE §3.2's closed form
  leaves it out; `count_sag=False` reproduces the closed form. The shuffle itself is fused into
  the ring (s-MoE §4 (a)): SRS moves exactly the bytes of a ring RS (equal chunks, by the align
  step), SAG those of a ring AG.
- `smoe-exact` (ours, issue 16): `smoe` preceded by a direct two-shot all-reduce (an
  all-to-all RS then AG, `simulate.logit_all_reduce`) of the partial router logits, T x N values of `SimOptions.logit_bytes` (fp32 by default, as the runtime sends them);
  its homes are those the real routing gives (`prerouter.exact_homes`), which is what the router
  chooses for the softmax-top-k families; for DeepSeek-V3 / GPT-OSS routers the simulated homes
  are optimistic (the pre-routed top-k only agrees with the router's at a measured rate).
- `ds-moe` all-reduces the whole batch then gives each device its contiguous chunk (DeepSpeed-MoE),
  so its homes never use a token scheduler; its A2A sends one copy per activation.
- `exflow` (ExFlow §IV-A): after a layer the token stays on the device of its first (top-1)
  expert; with top-k > 1 the other k - 1 expert outputs are sent there (the `combine` phase:
  "partial combine"), which ExFlow Table I does not count (`partial_combine=False` reproduces
  Table I). The per-iteration all-gather of the new tokens is charged once per batch, at the last
  layer: every device sends the tokens it holds to the G - 1 others (Table I writes G for G - 1).
- `exflow-prefill` (ours, issue 19): ExFlow in a prefill, as our runtime's `exflow` mode runs
  it. A token's attention needs the hidden states of its whole context at the same layer, and
  those sit on the devices of the previous layer's top-1 experts, so before every layer each
  device all-gathers the tokens it holds: `token_bytes + index_bytes` per token to each of the
  G - 1 others (the row and its int32 global token index), preceded by a size exchange
  (`SimOptions.size_bytes` per pair: the receivers do not know the block sizes). Its dispatch
  is one-shot and de-duplicated, each copy carrying the token index too (`index_bytes`: the
  top-1 device places the token in the next layer's context). No per-iteration all-gather:
  the per-layer one replaces it.
- Metadata, `separate`: an extra all-to-all before dispatch (CAMoE eq. 9's preprocess) carrying
  the token counts per expert (N x 4 bytes, every pair) and each copy's top-k ids and weights
  (k x 8 bytes); `one-shot` (s-MoE §4 (b)): the ids and weights ride in the dispatch packet, no
  metadata collective.
"""

from __future__ import annotations

from dataclasses import dataclass

from sempar.registry import Registry


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    name: str
    attention: str              # "tp" | "dp"
    steps: tuple[str, ...]      # in order: AR, RS, AG (rings), A2A-dispatch, A2A-combine
    dedup: bool                 # de-duplicate the dispatch (and combine)
    one_shot: bool              # metadata packed with the activations (s-MoE §4)
    scheduled: bool             # may place tokens with the online schedulers
    description: str
    aliases: tuple[str, ...] = ()
    chained: bool = False       # ExFlow: a token's home at layer l + 1 is its top-1 expert's device

    @property
    def knobs(self) -> tuple[str, ...]:
        """The options (SimOptions fields and Homes' choices) that change this pipeline's result;
        `sempar simulate` refuses the others when given. dedup / one_shot: the all-to-alls';
        schedule: token placement by the online schedulers (not ds-moe's contiguous chunks, not
        smoe-exact's pre-routed homes); policy: the request policy of attention-DP homes;
        count_sag: the closing shuffled all-gather of an RS ... AG pipeline; logit_bytes: the
        router-logit all-reduce."""
        out = ["dedup", "one_shot"] if self.expert_parallel else []
        if self.scheduled and "AR-logits" not in self.steps:
            out.append("schedule")
            if self.attention == "dp":
                out.append("policy")
        if "RS" in self.steps and "AG" in self.steps:
            out.append("count_sag")
        if "AR-logits" in self.steps:
            out.append("logit_bytes")
        return tuple(out)

    @property
    def expert_parallel(self) -> bool:
        return "A2A-dispatch" in self.steps


PIPELINES: Registry[Pipeline] = Registry("pipeline")


def _add(p: Pipeline) -> Pipeline:
    PIPELINES.add(p.name, p)
    for a in p.aliases:
        PIPELINES.add(a, p)
    return p


_add(Pipeline(name="ds-moe", attention="tp", steps=("AR", "A2A-dispatch", "A2A-combine", "AG"),
              dedup=False, one_shot=False, scheduled=False,
              description="DeepSpeed-MoE: attention TP + EP: AR -> A2A -> A2A -> AG"))
_add(Pipeline(name="sglang-tp", attention="tp", steps=("AR", "AR"),
              dedup=False, one_shot=False, scheduled=False,
              description="SGLang TP for attention and experts: AR + AR"))
_add(Pipeline(name="smoe", attention="tp", steps=("RS", "A2A-dispatch", "A2A-combine", "AG"),
              dedup=True, one_shot=True, scheduled=True,
              description="s-MoE / Sem-MoE attention TP with token re-batching: SRS -> A2A -> "
              "A2A -> SAG", aliases=("semmoe-tp",)))
_add(Pipeline(name="smoe-exact", attention="tp",
              steps=("AR-logits", "RS", "A2A-dispatch", "A2A-combine", "AG"),
              dedup=True, one_shot=True, scheduled=True,
              description="smoe with exact pre-routing: AR of [T, N] router logits -> SRS -> A2A "
              "-> A2A -> SAG, tokens homed by their real experts"))
_add(Pipeline(name="attn-dp", attention="dp", steps=("A2A-dispatch", "A2A-combine"),
              dedup=False, one_shot=False, scheduled=True,
              description="attention DP + EP: A2A dispatch -> A2A combine, no de-duplication"))
_add(Pipeline(name="sglang-ep", attention="dp", steps=("A2A-dispatch", "A2A-combine"),
              dedup=True, one_shot=True, scheduled=True,
              description="attention DP + EP as SGLang runs it with DeepEP: one-shot dedup "
              "dispatch -> combine"))
_add(Pipeline(name="exflow", attention="dp", steps=("A2A-dispatch", "A2A-combine", "AG-iteration"),
              dedup=False, one_shot=False, scheduled=True,
              description="ExFlow context-coherent EP: one A2A per layer + AG of new tokens per "
              "iteration", chained=True))
_add(Pipeline(name="exflow-prefill", attention="dp",
              steps=("AG-context", "A2A-dispatch", "A2A-combine"),
              dedup=True, one_shot=True, scheduled=True,
              description="ExFlow in a prefill (our runtime's exflow mode): AG of the held "
              "context (+ size exchange) -> one-shot dedup A2A -> partial combine, every layer",
              chained=True))

def pipeline_names() -> list[str]:
    """Distinct pipelines (aliases left out), in registration order."""
    seen, out = set(), []
    for n in PIPELINES:
        p = PIPELINES.get(n)
        if p.name not in seen:
            seen.add(p.name)
            out.append(p.name)
    return out
