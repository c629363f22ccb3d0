"""Runtime modes: one dispatcher class per mode behind `Dispatcher`, registered by name in
`DISPATCHERS`, each naming the simulator pipeline (comm/pipelines.py) whose bytes it sends.

Notation (every dispatcher):

    G ranks, this one `me`; L MoE layers; a batch of B requests x S positions, T = B * S tokens,
    token t = request t // S, position t % S (input_ids int64[B, S]); H hidden; N experts; top-k
    x      float32[n, H]  the residual stream of the n tokens this rank holds
    a      float32[n, H]  attention output (TP: this rank's partial sum over its heads)
    m      float32[n, H]  MoE input, post_attention_layernorm(x + a)
    ids    int64[n, k]    the model's router on m, w float32[n, k] its weights
    serve  int64[G, N]    serving device of expert e for a token homed on g (`serving_table`)
    home   the rank that holds a token while its MoE block runs (the simulator's homes)

All modes drive the HF model's own submodules (embeddings, rotary, per decoder layer
input_layernorm / self_attn / post_attention_layernorm / router `mlp.gate`, final norm, lm_head)
in the decoder layer's order, replacing only the routed experts (local ones, `LocalExperts`) and
adding the collectives. The dispatch prologue every mode shares (`Dispatcher.moe_block`, after
Megatron-core's token dispatchers: one base class, the layouts in subclasses): norm, the model's
router on the tokens this rank holds, then the one-shot de-duplicated dispatch, the local
experts and the combine (`dispatch.ep_moe`; exflow's chained variant).

| mode | class | attention | per MoE layer | token home (pipeline) |
| --- | --- | --- | --- | --- |
| `attn-dp` | `AttnDP` | DP: rank r runs its requests | dispatch -> combine (dedup, one-shot) | request rank (`sglang-ep`) |
| `tp-allreduce` | `TPAllReduce` | TP (heads split) | AR -> dispatch -> combine -> AG | contiguous chunk (`ds-moe`) |
| `tp-rebatch` | `TPRebatch` | TP | shuffled RS -> dispatch -> combine -> deferred shuffled AG (Sem-MoE §3.4, Alg. 3) | re-batched chunk (`smoe`) |
| `tp-exact` | `TPExact` | TP | AR of [T, N] partial router logits (`prerouting`) -> shuffled RS -> dispatch -> combine -> shuffled AG (ours, issue 16) | capacity-aligned home of the pre-routed experts (`smoe-exact`) |
| `exflow` | `ExFlow` | context-coherent | context AG -> dispatch -> partial combine to the top-1 device (ExFlow §IV-A) | layer 0: request rank; then top-1 device (`exflow`) |

tp-exact: every rank turns its partial attention output (rank 0 adds the residual) into partial
router logits W(w ⊙ p) (`schedule.prerouter`), all-reduces them (every rank then holds bitwise the
same [T, N]), selects each token's top-k, and homes it with the capacity-bound oracle rule
(`capacity_home`, the whole forward batch as one tp batch); the router then runs as usual on the
home rank, so the output is the same as every other mode's.

exflow in a prefill: a token's attention needs the keys of its context at the same layer, whose
hidden states sit on other ranks, so the runtime all-gathers the held hidden states (+ their
global index) at every layer (`context-ag`); ExFlow's paper all-gathers once per decode
iteration.

Logits (float32[B, S, V]) are computed on rank 0 from the final hidden states; the DP and
exflow modes gather them there first (collective `output`).

Timings (`Dispatcher.clock`, float64[L] seconds per layer and bucket on this rank, one forward):
`layer` the whole decoder layer; `moe_block` the router, dispatch, experts and combine;
`attn_comm` the collectives of the attention side: AR / RS / AG (TP), `context-ag` (exflow) and
tp-exact's `prerouting` all-reduce (a collective outside the MoE block that the homes need).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import numpy as np
import torch

from sempar.registry import Registry
from sempar.runtime.dispatch import Comm, ep_moe, ep_moe_chained, serving_table
from sempar.runtime.tp import tp_attention
from sempar.schedule import homes as home_rules
from sempar.schedule.prerouter import capacity_home, device_hits, prerouters
from sempar.schedule.rebatch import REBATCHERS, equal_chunks, plan_from_home

CLOCKS = ("layer", "moe_block", "attn_comm")


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


class LayerClock:
    """Seconds per layer in the buckets of `CLOCKS` (float64[L] each), summed over the sections
    timed; on CUDA the device is synchronised at both ends of a section."""

    def __init__(self, num_layers: int, device: torch.device):
        self.sync = device.type == "cuda"
        self.seconds = {k: np.zeros(num_layers) for k in CLOCKS}

    @contextmanager
    def __call__(self, bucket: str, layer: int) -> Iterator[None]:
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            self.seconds[bucket][layer] += time.perf_counter() - t0


class Dispatcher:
    """One rank's view of the model for one mode. experts: LocalExperts per MoE layer.
    Subclasses set `pipeline` (the simulator pipeline of the same bytes) and `tensor_parallel`
    and implement `run_layers(ids, batch)`: the decoder layers, returning the final hidden states
    float32[T, H] on rank 0 (None elsewhere where only rank 0 gathers them), and `homes(spec,
    experts)`: the home rule (schedule.homes) the simulator prices this mode's bytes with."""

    name: ClassVar[str]
    pipeline: ClassVar[str]
    tensor_parallel: ClassVar[bool] = False

    @staticmethod
    def homes(spec: Any, experts: np.ndarray) -> np.ndarray:
        """int32[T, L]: each token's home device per layer for a RunSpec `spec` whose routing is
        experts int[T, L, k] (what the simulator prices the mode's bytes with)."""
        raise NotImplementedError

    def __init__(self, model: Any, experts: list, placement: Any, comm: Comm,
                 rebatch: str = "align"):
        self.model, self.experts, self.comm = model, experts, comm
        self.cfg = model.config
        self.inner = model.model
        self.layers = list(self.inner.layers)
        self.rebatch = rebatch
        self.serve = [serving_table(placement, l, comm.device) for l in range(len(self.layers))]
        if self.tensor_parallel:
            nh, nkv = self.cfg.num_attention_heads, self.cfg.num_key_value_heads
            self.attn = [tp_attention(ly.self_attn, comm.rank, comm.world, nh, nkv)
                         for ly in self.layers]
        else:
            self.attn = [ly.self_attn for ly in self.layers]
        self.clock = LayerClock(len(self.layers), comm.device)

    def reset_clock(self) -> None:
        self.clock = LayerClock(len(self.layers), self.comm.device)

    # ------------------------------------------------------------------ shared steps
    def attend(self, l: int, x: torch.Tensor) -> torch.Tensor:
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

    def route(self, l: int, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's router on m float32[n, H]: (ids int64[n, k], weights float32[n, k])."""
        gate = self.layers[l].mlp.gate
        if m.shape[0] == 0:
            k = int(gate.top_k)
            return (torch.zeros((0, k), dtype=torch.int64, device=m.device),
                    torch.zeros((0, k), dtype=m.dtype, device=m.device))
        _, w, ids = gate(m)
        return ids.long(), w.to(m.dtype)

    def prologue(self, l: int, r: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dispatch prologue: r float32[n, H] residual after attention -> (m the MoE input
        post_attention_layernorm(r), ids int64[n, k], w float32[n, k] the model's router on m)."""
        m = self.layers[l].post_attention_layernorm(r) if r.shape[0] else r
        ids, w = self.route(l, m)
        return m, ids, w

    def moe_block(self, l: int, r: torch.Tensor) -> torch.Tensor:
        """The EP MoE block, timed as `moe_block`: r float32[n, H] -> r + MoE(m), the output
        back on this rank (dispatch, local experts, combine: `dispatch.ep_moe`)."""
        with self.clock("moe_block", l):
            m, ids, w = self.prologue(l, r)
            return r + ep_moe(m, ids, w, self.serve[l], self.experts[l], self.comm, l)

    def gather_output(self, x: torch.Tensor, gid: torch.Tensor, T: int) -> torch.Tensor | None:
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

    @torch.no_grad()
    def forward(self, batch: Batch) -> torch.Tensor | None:
        """Logits float32[B, S, V] on rank 0, None elsewhere."""
        ids = batch.input_ids.to(self.comm.device)
        B, S = ids.shape
        x = self.run_layers(ids, batch)
        if x is None:
            return None
        return self.model.lm_head(self.inner.norm(x.view(B, S, self.cfg.hidden_size)))

    def run_layers(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        raise NotImplementedError


DISPATCHERS: Registry[type[Dispatcher]] = Registry("runtime mode")


def _mode(name: str, pipeline: str, tensor_parallel: bool = False):
    def deco(cls: type[Dispatcher]) -> type[Dispatcher]:
        cls.name, cls.pipeline, cls.tensor_parallel = name, pipeline, tensor_parallel
        return DISPATCHERS.add(name, cls)

    return deco


def request_tokens(batch: Batch, rank: int, S: int, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mine int64[b] the requests of `rank`, gid int64[b * S] their tokens' global index)."""
    mine = (batch.request_rank.to(device) == rank).nonzero()[:, 0]
    return mine, (mine[:, None] * S + torch.arange(S, device=device)[None]).reshape(-1)


@_mode("attn-dp", "sglang-ep")
class AttnDP(Dispatcher):
    """Attention DP: rank r runs the attention of its requests, then the EP MoE block."""

    @staticmethod
    def homes(spec: Any, experts: np.ndarray) -> np.ndarray:
        """int32[T, L]: every token on its request's rank."""
        B, S = spec.input_ids.shape
        return home_rules.home_from_ranks(np.repeat(np.arange(B), S),
                                          np.asarray(spec.request_rank), experts.shape[1])

    def run_layers(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        B, S = ids.shape
        mine, gid = request_tokens(batch, self.comm.rank, S, ids.device)
        x = self.inner.embed_tokens(ids[mine])                          # [b, S, H]
        H = x.shape[-1]
        for l in range(len(self.layers)):
            with self.clock("layer", l):
                r = x + self.attend(l, x)
                x = self.moe_block(l, r.reshape(-1, H)).view(r.shape)
        return self.gather_output(x.reshape(-1, H), gid, B * S)


@_mode("tp-allreduce", "ds-moe", tensor_parallel=True)
class TPAllReduce(Dispatcher):
    """Attention TP: all-reduce the attention output, each rank the MoE block of its contiguous
    chunk (the simulator's home_tp_contiguous: token i -> i * G // T), all-gather the chunks."""

    @staticmethod
    def homes(spec: Any, experts: np.ndarray) -> np.ndarray:
        """int32[T, L]: equal contiguous chunks of the batch."""
        T = spec.input_ids.numel()
        return home_rules.home_tp_contiguous(T, spec.placement.num_devices, experts.shape[1],
                                             batch=T)

    def run_layers(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor:
        B, S = ids.shape
        T, G, me = B * S, self.comm.world, self.comm.rank
        H = self.cfg.hidden_size
        x = self.inner.embed_tokens(ids).reshape(T, H)                  # replicated
        dev = torch.arange(T, device=ids.device) * G // max(T, 1)
        chunks = torch.bincount(dev, minlength=G).tolist()
        lo = sum(chunks[:me])
        for l in range(len(self.layers)):
            with self.clock("layer", l):
                a_part = self.attend(l, x.view(B, S, H)).reshape(T, H)
                with self.clock("attn_comm", l):
                    a = self.comm.all_reduce(a_part, l)
                y = self.moe_block(l, (x + a)[lo:lo + chunks[me]])
                with self.clock("attn_comm", l):
                    x, _ = self.comm.all_gather_v(y, l, "all-gather", chunks)
        return x


class Shuffled(Dispatcher):
    """The shuffled TP layer: per layer a re-batching plan (`plan(l, x, a_part)`), the
    reduce-scatter of the attention output in plan order, the MoE block of this rank's chunk,
    the deferred shuffled all-gather, tokens resumed to their order (Sem-MoE §3.4, Alg. 3)."""

    def plan(self, l: int, x: torch.Tensor, a_part: torch.Tensor, batch: Batch):
        raise NotImplementedError

    def run_layers(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor:
        B, S = ids.shape
        T, me = B * S, self.comm.rank
        H = self.cfg.hidden_size
        x = self.inner.embed_tokens(ids).reshape(T, H)
        for l in range(len(self.layers)):
            with self.clock("layer", l):
                a_full = self.attend(l, x.view(B, S, H)).reshape(T, H)
                plan = self.plan(l, x, a_full, batch)
                chunks = plan.chunk_sizes.tolist()
                off = sum(chunks[:me])
                with self.clock("attn_comm", l):
                    a = self.comm.reduce_scatter_v(a_full.index_select(0, plan.perm), chunks, l,
                                                   "reduce-scatter")
                rows = plan.perm[off:off + chunks[me]]
                y = self.moe_block(l, x.index_select(0, rows) + a)
                with self.clock("attn_comm", l):
                    xs, _ = self.comm.all_gather_v(y, l, "all-gather", chunks)
                x = xs.index_select(0, plan.inverse)
        return x


@_mode("tp-rebatch", "smoe", tensor_parallel=True)
class TPRebatch(Shuffled):
    """Sem-MoE Alg. 3: re-batch by the predicted device (batch.targets, their priority)."""

    @staticmethod
    def homes(spec: Any, experts: np.ndarray) -> np.ndarray:
        """int32[T, L]: the re-batching plan's device per layer."""
        prio = spec.priority                               # targets, priority: [L, T]
        return home_rules.rebatched_home(spec.targets.T, spec.placement.num_devices,
                                         None if prio is None else prio.T,
                                         batch=spec.input_ids.numel())

    def plan(self, l: int, x: torch.Tensor, a_part: torch.Tensor, batch: Batch):
        T = x.shape[0]
        target = (batch.targets[l].to(x.device) if batch.targets is not None
                  else torch.full((T,), -1, dtype=torch.int64, device=x.device))
        prio = batch.priority[l].to(x.device) if batch.priority is not None else None
        return REBATCHERS.get(self.rebatch)(target, self.comm.world, prio)


@_mode("tp-exact", "smoe-exact", tensor_parallel=True)
class TPExact(Shuffled):
    """Exact pre-routing (schedule.prerouter): all-reduce the partial router logits, home every
    token by its real experts, then tp-rebatch's shuffled RS / MoE / shuffled AG."""

    @staticmethod
    def homes(spec: Any, experts: np.ndarray) -> np.ndarray:
        """int32[T, L]: the capacity-bound oracle of the real routing (exact pre-routing)."""
        return home_rules.oracle_home(spec.placement, experts, spec.input_ids.numel())

    def __init__(self, model: Any, experts: list, placement: Any, comm: Comm,
                 rebatch: str = "align"):
        super().__init__(model, experts, placement, comm, rebatch)
        self.pre = prerouters(model)
        self.hosts = [torch.as_tensor(placement.hosts()[l]).to(comm.device)
                      for l in range(len(self.layers))]

    def plan(self, l: int, x: torch.Tensor, a_part: torch.Tensor, batch: Batch):
        pre = self.pre[l]
        with self.clock("attn_comm", l):
            z = self.comm.all_reduce(pre.partial_logits(a_part + x if self.comm.rank == 0
                                                        else a_part), l, "prerouting")
        eids = pre.select(z, None if pre.exact else pre.residual_scale(x))
        home = capacity_home(device_hits(eids, self.hosts[l]))
        return plan_from_home(home, equal_chunks(home.shape[0], self.comm.world, home.device))


@_mode("exflow", "exflow-prefill")
class ExFlow(Dispatcher):
    """ExFlow §IV-A: context-coherent attention (every rank gets every held token's hidden
    state), then one dispatch; the token stays on its top-1 expert's device."""

    homes = staticmethod(AttnDP.homes)  # layer 0 on the request's rank; the pipeline chains

    def run_layers(self, ids: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        B, S = ids.shape
        T, H = B * S, self.cfg.hidden_size
        mine, gid = request_tokens(batch, self.comm.rank, S, ids.device)
        x = self.inner.embed_tokens(ids[mine]).reshape(gid.numel(), H)
        for l in range(len(self.layers)):
            with self.clock("layer", l):
                rows = torch.cat([gid.to(torch.int32).view(torch.float32)[:, None], x], 1)
                with self.clock("attn_comm", l):
                    got, _ = self.comm.all_gather_v(rows, l, "context-ag")
                full = torch.empty((T, H), dtype=x.dtype, device=x.device)
                full[got[:, 0].contiguous().view(torch.int32).long()] = got[:, 1:]
                a = self.attend(l, full.view(B, S, H)).reshape(T, H)
                r = x + a.index_select(0, gid)
                with self.clock("moe_block", l):
                    _, eids, w = self.prologue(l, r)
                    x, gid = ep_moe_chained(r, gid, eids, w, self.serve[l], self.experts[l],
                                            self.comm, l, self.layers[l].post_attention_layernorm)
        return self.gather_output(x, gid, T)


MODES = tuple(DISPATCHERS.names())


def dispatcher(mode: str, model: Any, experts: list, placement: Any, comm: Comm,
               rebatch: str = "align") -> Dispatcher:
    """The registered dispatcher of `mode` for this rank (InputError naming the modes if
    unknown)."""
    return DISPATCHERS.get(mode)(model, experts, placement, comm, rebatch)
