"""The four execution modes: one forward (prefill) of a batch of equal-length requests.

All modes drive the HF model's own submodules (embeddings, rotary, per decoder layer
input_layernorm / self_attn / post_attention_layernorm / router `mlp.gate`, final norm, lm_head)
in the decoder layer's order, replacing only the routed experts (local ones, `LocalExperts`) and
adding the collectives. The router is the model's, unchanged, run on every rank for the tokens
it holds. Token t of the batch is request t // S, position t % S (input_ids int64[B, S]).

| mode | attention | per MoE layer | token home (simulator pipeline) |
| --- | --- | --- | --- |
| `attn-dp` | DP: rank r runs its requests | dispatch -> combine (dedup, one-shot) | request rank (`sglang-ep`) |
| `tp-allreduce` | TP (heads split) | AR -> dispatch -> combine -> AG | contiguous chunk (`ds-moe`) |
| `tp-rebatch` | TP | shuffled RS -> dispatch -> combine -> deferred shuffled AG (Sem-MoE §3.4, Alg. 3) | re-batched chunk (`smoe`) |
| `tp-exact` | TP | AR of [T, N] partial router logits (`prerouting`) -> shuffled RS -> dispatch -> combine -> shuffled AG (ours, issue 16) | capacity-aligned home of the pre-routed experts (`smoe-exact`) |
| `exflow` | context-coherent | context AG -> dispatch -> partial combine to the top-1 device (ExFlow §IV-A) | layer 0: request rank; then top-1 device (`exflow`) |

tp-exact: every rank turns its partial attention output (rank 0 adds the residual) into partial
router logits W(w ⊙ p) (`schedule.prerouter`), all-reduces them (every rank then holds bitwise the
same [T, N]), selects each token's top-k, and homes it with the capacity-bound oracle rule
(`capacity_home`, the whole forward batch as one tp batch); the router then runs as usual on the
home rank, so the output is the same as every other mode's.

Logits (float32[B, S, V]) are computed on rank 0 from the final hidden states; the DP and
exflow modes gather them there first (collective `output`).

exflow in a prefill: a token's attention needs the keys of its context at the same layer, whose
hidden states sit on other ranks, so the runtime all-gathers the held hidden states (+ their
global index) at every layer (`context-ag`); ExFlow's paper all-gathers once per decode
iteration (the simulator charges that once, at the last layer).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from sempar.errors import InputError
from sempar.runtime.dispatch import Comm, ep_moe, ep_moe_chained, serving_table
from sempar.schedule.prerouter import capacity_home, device_hits, prerouters
from sempar.schedule.rebatch import REBATCHERS, equal_chunks, plan_from_home

MODES = ("attn-dp", "tp-allreduce", "tp-rebatch", "tp-exact", "exflow")


@dataclass
class Batch:
    """input_ids: int64[B, S]; request_rank: int64[B] DP rank of each request (attn-dp, exflow);
    targets: int64[L, B*S] preferred device per token and layer for tp-rebatch (-1: none);
    priority: float[L, B*S] or None, the targets' confidences: a full device keeps its most
    confident tokens (`rebatch.plan_align`)."""

    input_ids: torch.Tensor
    request_rank: torch.Tensor
    targets: torch.Tensor | None = None
    priority: torch.Tensor | None = None


def tp_attention(attn: Any, rank: int, world: int, num_heads: int, num_kv: int) -> Any:
    """A copy of the attention module holding rank's heads (Megatron TP): q/k/v rows and o_proj
    columns of its heads; KV heads are replicated when world > num_kv. Its output is a partial
    sum over heads (to be all-reduced / reduce-scattered)."""
    if num_heads % world:
        raise InputError(f"tensor parallelism: {num_heads} attention heads do not split over "
                         f"{world} ranks")
    hd = attn.head_dim
    per = num_heads // world
    groups = num_heads // num_kv
    q_heads = list(range(rank * per, (rank + 1) * per))
    kv_heads = sorted({h // groups for h in q_heads})
    if per % len(kv_heads):
        raise InputError(f"tensor parallelism: {per} query heads per rank do not share "
                         f"{len(kv_heads)} KV heads evenly")
    a = copy.deepcopy(attn)

    def rows(heads: list[int]) -> torch.Tensor:
        return torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in heads])

    q, kv = rows(q_heads), rows(kv_heads)
    with torch.no_grad():
        for name, r in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            lin = getattr(a, name)
            lin.weight = torch.nn.Parameter(lin.weight[r].clone())
            if lin.bias is not None:
                lin.bias = torch.nn.Parameter(lin.bias[r].clone())
        a.o_proj.weight = torch.nn.Parameter(a.o_proj.weight[:, q].clone())
        if a.o_proj.bias is not None and rank != 0:
            a.o_proj.bias = torch.nn.Parameter(torch.zeros_like(a.o_proj.bias))
    a.num_key_value_groups = per // len(kv_heads)
    return a


class Runner:
    """One rank's view of the model for one mode. experts: LocalExperts per MoE layer."""

    def __init__(self, model: Any, experts: list, placement: Any, comm: Comm, mode: str,
                 rebatch: str = "align"):
        if mode not in MODES:
            raise InputError(f"--mode: {mode!r} is not one of {', '.join(MODES)}")
        self.model, self.experts, self.comm, self.mode = model, experts, comm, mode
        self.cfg = model.config
        self.inner = model.model
        self.layers = list(self.inner.layers)
        self.rebatch = rebatch
        self.serve = [serving_table(placement, l, comm.device) for l in range(len(self.layers))]
        if mode.startswith("tp"):
            nh, nkv = self.cfg.num_attention_heads, self.cfg.num_key_value_heads
            self.attn = [tp_attention(ly.self_attn, comm.rank, comm.world, nh, nkv)
                         for ly in self.layers]
        else:
            self.attn = [ly.self_attn for ly in self.layers]
        if mode == "tp-exact":
            self.pre = prerouters(model)
            self.hosts = [torch.as_tensor(placement.hosts()[l]).to(comm.device)
                          for l in range(len(self.layers))]
        self.timings: list[float] = [0.0] * len(self.layers)

    # ------------------------------------------------------------------ helpers
    def _attend(self, l: int, x: torch.Tensor) -> torch.Tensor:
        """x: float32[b, S, H] -> attention output [b, S, H] (partial over heads in TP)."""
        if x.shape[0] == 0:
            return torch.zeros_like(x)
        from transformers.masking_utils import create_causal_mask

        pos = torch.arange(x.shape[1], device=x.device)[None]
        mask = create_causal_mask(config=self.cfg, inputs_embeds=x, attention_mask=None,
                                  past_key_values=None, position_ids=pos)
        pe = self.inner.rotary_emb(x, position_ids=pos)
        h = self.layers[l].input_layernorm(x)
        return self.attn[l](hidden_states=h, position_embeddings=pe, attention_mask=mask)[0]

    def _route(self, l: int, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's router on m float32[n, H]: (ids int64[n, k], weights float32[n, k])."""
        gate = self.layers[l].mlp.gate
        if m.shape[0] == 0:
            k = int(gate.top_k)
            return (torch.zeros((0, k), dtype=torch.int64, device=m.device),
                    torch.zeros((0, k), dtype=m.dtype, device=m.device))
        _, w, ids = gate(m)
        return ids.long(), w.to(m.dtype)

    def _moe(self, l: int, r: torch.Tensor) -> torch.Tensor:
        """r: float32[n, H] residual after attention -> r + MoE(post_norm(r))."""
        m = self.layers[l].post_attention_layernorm(r) if r.shape[0] else r
        ids, w = self._route(l, m)
        return r + ep_moe(m, ids, w, self.serve[l], self.experts[l], self.comm, l)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.inner.norm(x))

    def _gather_output(self, x: torch.Tensor, gid: torch.Tensor, T: int) -> torch.Tensor | None:
        """Send (gid, x) rows to rank 0; there, float32[T, H] in global token order."""
        G, me = self.comm.world, self.comm.rank
        rows = torch.cat([gid.to(torch.int32).view(torch.float32)[:, None].to(x.dtype), x], 1)
        counts = [rows.shape[0] if d == 0 else 0 for d in range(G)]
        got, _ = self.comm.all_to_all_v(rows, counts, -1, "output")
        if me != 0:
            return None
        out = torch.empty((T, x.shape[1]), dtype=x.dtype, device=x.device)
        out[got[:, 0].contiguous().view(torch.int32).long()] = got[:, 1:]
        return out

    # ------------------------------------------------------------------ modes
    @torch.no_grad()
    def forward(self, batch: Batch) -> torch.Tensor | None:
        """Logits float32[B, S, V] on rank 0, None elsewhere."""
        ids = batch.input_ids.to(self.comm.device)
        B, S = ids.shape
        fn = {"attn-dp": self._dp, "tp-allreduce": self._tp_ar, "tp-rebatch": self._tp_rebatch,
              "tp-exact": self._tp_exact, "exflow": self._exflow}[self.mode]
        x = fn(ids, batch)
        if x is None:
            return None
        return self._logits(x.view(B, S, self.cfg.hidden_size))

    def _timed(self, l: int, t0: float) -> None:
        import time

        self.timings[l] += time.perf_counter() - t0

    def _dp(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        import time

        B, S = ids.shape
        mine = (batch.request_rank.to(ids.device) == self.comm.rank).nonzero()[:, 0]
        x = self.inner.embed_tokens(ids[mine])                          # [b, S, H]
        H = x.shape[-1]
        for l in range(len(self.layers)):
            t0 = time.perf_counter()
            r = x + self._attend(l, x)
            x = self._moe(l, r.reshape(-1, H)).view(r.shape)
            self._timed(l, t0)
        gid = (mine[:, None] * S + torch.arange(S, device=ids.device)[None]).reshape(-1)
        return self._gather_output(x.reshape(-1, H), gid, B * S)

    def _tp_ar(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor:
        import time

        B, S = ids.shape
        T, G, me = B * S, self.comm.world, self.comm.rank
        H = self.cfg.hidden_size
        x = self.inner.embed_tokens(ids).reshape(T, H)                  # replicated
        # contiguous chunks, the simulator's home_tp_contiguous: token i -> i * G // T
        dev = torch.arange(T, device=ids.device) * G // max(T, 1)
        chunks = torch.bincount(dev, minlength=G).tolist()
        lo = sum(chunks[:me])
        for l in range(len(self.layers)):
            t0 = time.perf_counter()
            a = self.comm.all_reduce(self._attend(l, x.view(B, S, H)).reshape(T, H), l)
            r = x + a
            y = self._moe(l, r[lo:lo + chunks[me]])
            x, _ = self.comm.all_gather_v(y, l, "all-gather", chunks)
            self._timed(l, t0)
        return x

    def _tp_rebatch(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Sem-MoE Alg. 3: re-batch by the predicted device, shuffled reduce-scatter (each rank
        gets the summed attention output of its re-batched chunk), MoE, deferred shuffled
        all-gather, tokens resumed to their order."""
        T = ids.numel()
        plan_fn = REBATCHERS.get(self.rebatch)

        def plan(l: int, x: torch.Tensor, a_part: torch.Tensor):
            target = (batch.targets[l].to(ids.device) if batch.targets is not None
                      else torch.full((T,), -1, dtype=torch.int64, device=ids.device))
            prio = batch.priority[l].to(ids.device) if batch.priority is not None else None
            return plan_fn(target, self.comm.world, prio)

        return self._tp_shuffled(ids, plan)

    def _tp_exact(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Exact pre-routing (schedule.prerouter): all-reduce the partial router logits, home
        every token by its real experts, then the shuffled RS / MoE / shuffled AG of tp-rebatch."""
        G = self.comm.world

        def plan(l: int, x: torch.Tensor, a_part: torch.Tensor):
            pre = self.pre[l]
            z = self.comm.all_reduce(pre.partial_logits(a_part + x if self.comm.rank == 0
                                                        else a_part), l, "prerouting")
            eids = pre.select(z, None if pre.exact else pre.residual_scale(x))
            home = capacity_home(device_hits(eids, self.hosts[l]))
            return plan_from_home(home, equal_chunks(home.shape[0], G, home.device))

        return self._tp_shuffled(ids, plan)

    def _tp_shuffled(self, ids: torch.Tensor, plan_of) -> torch.Tensor:
        """The shuffled tp layer loop; plan_of(l, x [T, H], partial attention [T, H]) -> plan."""
        import time

        B, S = ids.shape
        T, me = B * S, self.comm.rank
        H = self.cfg.hidden_size
        x = self.inner.embed_tokens(ids).reshape(T, H)
        for l in range(len(self.layers)):
            t0 = time.perf_counter()
            a_full = self._attend(l, x.view(B, S, H)).reshape(T, H)
            plan = plan_of(l, x, a_full)
            chunks = plan.chunk_sizes.tolist()
            off = sum(chunks[:me])
            a = self.comm.reduce_scatter_v(a_full.index_select(0, plan.perm), chunks, l,
                                           "reduce-scatter")
            rows = plan.perm[off:off + chunks[me]]
            y = self._moe(l, x.index_select(0, rows) + a)
            xs, _ = self.comm.all_gather_v(y, l, "all-gather", chunks)
            x = xs.index_select(0, plan.inverse)
            self._timed(l, t0)
        return x

    def _exflow(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        import time

        B, S = ids.shape
        T = B * S
        mine = (batch.request_rank.to(ids.device) == self.comm.rank).nonzero()[:, 0]
        gid = (mine[:, None] * S + torch.arange(S, device=ids.device)[None]).reshape(-1)
        H = self.cfg.hidden_size
        x = self.inner.embed_tokens(ids[mine]).reshape(gid.numel(), H)
        for l in range(len(self.layers)):
            t0 = time.perf_counter()
            # context coherence: every rank gets every held token's hidden state
            rows = torch.cat([gid.to(torch.int32).view(torch.float32)[:, None], x], 1)
            got, _ = self.comm.all_gather_v(rows, l, "context-ag")
            full = torch.empty((T, H), dtype=x.dtype, device=x.device)
            full[got[:, 0].contiguous().view(torch.int32).long()] = got[:, 1:]
            a = self._attend(l, full.view(B, S, H)).reshape(T, H)
            r = x + a.index_select(0, gid)
            norm = self.layers[l].post_attention_layernorm
            m = norm(r) if r.shape[0] else r
            eids, w = self._route(l, m)
            x, gid = ep_moe_chained(r, gid, eids, w, self.serve[l], self.experts[l], self.comm,
                                    l, norm)
            self._timed(l, t0)
        return self._gather_output(x, gid, T)
