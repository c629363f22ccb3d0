"""Attention-TP token re-batching (Sem-MoE App. B Alg. 3; s-MoE App. Alg. 2).

Before the shuffled reduce-scatter each of the T tokens of a batch is sent to the device hosting
the experts it is predicted to activate; after the shuffled all-gather the batch is put back in its
original order. Alg. 3 in the paper's words:

    dev_ids     <- cond(T_p[B] > A_p[B], T[B], A[B])        # choose_devices
    shf_indices <- argsort(dev_ids)                          # rebatch (align strategy)
    g_shf       <- align(group_by_key(shf_indices))
    B           <- B[concat(g_shf)]
    ... reduce_scatter, MoE layer, all_gather ...
    B           <- B[argsort(shf_indices)]                   # resume_tokens

The paper leaves `align` unspecified; we follow docs/design.md ("Home device", Attention-TP): the
reduce-scatter needs equal chunks, so device g receives exactly T // G tokens, the first T % G
devices one more. Each device first keeps the earliest tokens (by position) that prefer it, up to
its capacity; the overflow and the tokens with no preference then fill the remaining room of the
devices in device order, or, given per-device scores, each spilled token goes to its own
next-best device with room (proposal rounds, `propose`; the capacity-bound oracle's rule). The
paper computes the inverse with a second argsort; we scatter it in O(T) while building the plan.

Everything runs as torch ops on the input's device, with no host synchronisation, so the same code
serves the CPU simulator and a CUDA runtime; the one exception is the next-best spill (`scores`
given), whose proposal rounds (`placement.capacity.proposal_rounds`) run on the host.
Strategies are registered by name in `REBATCHERS` (`align`, the paper's; `none`, vanilla TP's
contiguous split by position).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sempar.errors import InputError
from sempar.placement.capacity import equal_shares, proposal_rounds
from sempar.registry import Registry


@dataclass(frozen=True)
class RebatchPlan:
    """How one batch of T tokens was re-batched over G devices.

    perm: int64[T]         new position i holds original token perm[i] (Alg. 3's shf_indices)
    inverse: int64[T]      original token j sits at new position inverse[j] (argsort(perm))
    chunk_sizes: int64[G]  rows of device g's chunk; chunk g is rows [offsets[g], offsets[g+1])
    """

    perm: torch.Tensor
    inverse: torch.Tensor
    chunk_sizes: torch.Tensor

    @property
    def num_devices(self) -> int:
        return int(self.chunk_sizes.shape[0])

    @property
    def offsets(self) -> torch.Tensor:
        """int64[G + 1]: start row of each chunk, then T."""
        return torch.cat([self.chunk_sizes.new_zeros(1), torch.cumsum(self.chunk_sizes, 0)])

    def home_device(self) -> torch.Tensor:
        """int64[T]: the device each original token was sent to (its home device at this layer)."""
        G = self.num_devices
        dev_at_row = torch.repeat_interleave(torch.arange(G, device=self.perm.device),
                                             self.chunk_sizes, output_size=self.perm.shape[0])
        return dev_at_row.index_select(0, self.inverse)


RebatchStrategy = Callable[[torch.Tensor, int, torch.Tensor | None], RebatchPlan]
REBATCHERS: Registry[RebatchStrategy] = Registry("rebatch strategy")


def equal_chunks(num_tokens: int, num_devices: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int64[G] on `device`: `capacity.equal_shares` of the T rows (reduce-scatter's split)."""
    if num_devices < 1:
        raise InputError(f"num_devices must be >= 1, got {num_devices}")
    return torch.from_numpy(equal_shares(num_tokens, num_devices)).to(device)


def choose_devices(t_dev: torch.Tensor, t_conf: torch.Tensor,
                   a_dev: torch.Tensor, a_conf: torch.Tensor) -> torch.Tensor:
    """Per token, the device predicted by the more confident table (Alg. 3 line 2).

    t_dev: int[T], t_conf: float[T]  token -> device table T and its confidence T_p, looked up
                                     at the batch's token ids;
    a_dev: int[T], a_conf: float[T]  n-gram device-sequence table A and its confidence A_p.
    Returns int64[T]. As in the paper (`cond(T_p > A_p, T, A)`) a tie goes to A. An entry of -1
    means the table has no prediction: it loses whatever its confidence, and a token that neither
    table knows gets -1 (no preference).
    """
    shapes = {t_dev.shape, t_conf.shape, a_dev.shape, a_conf.shape}
    if len(shapes) != 1 or t_dev.dim() != 1:
        raise InputError(f"choose_devices needs four 1-D tensors of one length, got shapes "
                         f"{[tuple(s) for s in (t_dev.shape, t_conf.shape, a_dev.shape, a_conf.shape)]}")
    t_dev, a_dev = t_dev.long(), a_dev.long()
    use_t = (t_dev >= 0) & ((a_dev < 0) | (t_conf > a_conf))
    return torch.where(use_t, t_dev, a_dev).clamp_min(-1)


def _check(target: torch.Tensor, num_devices: int) -> torch.Tensor:
    if target.dim() != 1 or target.dtype.is_floating_point or target.dtype == torch.bool:
        raise InputError(f"target must be a 1-D integer tensor, got {target.dtype} {tuple(target.shape)}")
    if num_devices < 1:
        raise InputError(f"num_devices must be >= 1, got {num_devices}")
    return target.long()


def propose(pref: torch.Tensor, priority: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
    """int64[n]: device per token by proposal rounds (-1: not placed), capacities int64[G].

    pref: int64[n, R] each token's devices in its order of preference (-1 entries: none);
    priority: float[n]. `placement.capacity.proposal_rounds` (a full device spills a token to
    *that token's* next-best device), run on the host: one round trip per call.
    """
    home, _ = proposal_rounds(pref.cpu().numpy(), priority.float().cpu().numpy(),
                              cap.cpu().numpy())
    return torch.from_numpy(home).to(pref.device)


def plan_from_home(home: torch.Tensor, cap: torch.Tensor) -> RebatchPlan:
    """The plan that sends token t to home[t] int64[T] (every home given, `cap` rows per device,
    each device's tokens in their original order)."""
    perm = torch.argsort(home, stable=True)
    inverse = torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.shape[0], device=perm.device))
    return RebatchPlan(perm=perm, inverse=inverse, chunk_sizes=cap)


def _align_next_best(target: torch.Tensor, G: int, priority: torch.Tensor | None,
                     scores: torch.Tensor) -> RebatchPlan:
    """`plan_align` with `scores`: proposal rounds over [target, then the other devices by
    decreasing score]; tokens without a preference fill the room left in device order."""
    T, dev = target.shape[0], target.device
    cap = equal_chunks(T, G, dev)
    has = (target >= 0) & (target < G)
    t = torch.where(has, target, 0)
    s = scores.float().scatter(1, t[:, None], float("inf"))                # target first
    pref = torch.where(has[:, None], torch.argsort(-s, dim=1, stable=True), -1)
    prio = priority if priority is not None else torch.zeros(T, device=dev)
    home = propose(pref, prio, cap)
    left = cap - torch.zeros(G, dtype=torch.int64, device=dev).scatter_add_(
        0, home.clamp_min(0), (home >= 0).long())
    rest = (home < 0).nonzero()[:, 0]
    home[rest] = torch.repeat_interleave(torch.arange(G, device=dev), left)[: rest.numel()]
    return plan_from_home(home, cap)


@REBATCHERS.register("align")
def plan_align(target: torch.Tensor, num_devices: int,
               priority: torch.Tensor | None = None, scores: torch.Tensor | None = None
               ) -> RebatchPlan:
    """Alg. 3 lines 3-6: argsort by preferred device, group, align to equal chunks, concatenate.

    target: int[T], the preferred device per token; -1 (or any value outside [0, G), which we do
    not check because a check would cost a host sync per layer) means no preference.
    priority: float[T] or None. The paper does not say which tokens a full device keeps; by
    default the earliest (stable order). With `priority` (ours: the prediction's confidence) a
    device keeps its most confident tokens and the least sure ones overflow.
    scores: float[T, G] or None, how much each token prefers each device (e.g. its predicted
    activation share). The paper does not say where the overflow goes either; with `scores`
    (ours) a full device spills each token to its next-best device (`propose`, the
    capacity-bound oracle's rule); without, the overflow fills the free room in device order.
    """
    target = _check(target, num_devices)
    if scores is not None:
        return _align_next_best(target, num_devices, priority, scores)
    T, G, dev = target.shape[0], num_devices, target.device
    cap = equal_chunks(T, G, dev)
    offset = torch.cumsum(cap, 0) - cap
    # Key G sorts the tokens without a preference after every device group.
    key = torch.where((target >= 0) & (target < G), target, G)
    if priority is None:
        order = torch.argsort(key, stable=True)
    else:
        by_priority = torch.argsort(-priority.float(), stable=True)
        order = by_priority.index_select(0, torch.argsort(key.index_select(0, by_priority), stable=True))
    ar = torch.arange(T, device=dev)
    sorted_pos = torch.empty_like(order).scatter_(0, order, ar)
    # scatter_add_, not bincount: bincount reads the maximum back to the host on CUDA.
    counts = torch.zeros(G + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
    zero = cap.new_zeros(1)
    keep = torch.minimum(counts, torch.cat([cap, zero]))          # key G has no room of its own
    left = counts - keep
    room = cap - keep[:G]
    room_end = torch.cumsum(room, 0)
    # Per-key constants fetched in one gather: few [T]-sized kernels matter more than [G]-sized ones.
    per_key = torch.stack([torch.cumsum(counts, 0) - counts, keep, torch.cumsum(left, 0) - left,
                           torch.cat([offset, zero])])
    # index_select, not per_key[:, key]: advanced indexing from a tiny source took 5 ms against
    # 0.03 ms for 16k tokens on the shared 2-thread CPU (torch 2.13).
    start_k, keep_k, left_before_k, offset_k = per_key.index_select(1, key)
    rank = sorted_pos - start_k                                   # stable rank inside the group
    # Leftovers (overflow, no preference) keep their sorted order; m indexes them, and the devices'
    # free rooms laid end to end take them in device order.
    m = left_before_k + rank - keep_k
    # Device of leftover m: the free rooms laid out as a [T] table (padded with device G for the
    # T - sum(room) kept tokens, so output_size needs no host sync). searchsorted(room_end, m) is
    # the same answer but took 6 ms against 0.2 ms on the shared 2-thread CPU.
    fill_dev = torch.repeat_interleave(torch.arange(G + 1, device=dev),
                                       torch.cat([room, T - room_end[-1:]]), output_size=T)
    d = fill_dev.index_select(0, m.clamp(0, max(T - 1, 0)))     # kept tokens: any valid index
    fill_base = torch.cat([offset + keep[:G] - (room_end - room), zero])
    inverse = torch.where(rank < keep_k, offset_k + rank, fill_base.index_select(0, d) + m)
    perm = torch.empty_like(inverse).scatter_(0, inverse, ar)
    return RebatchPlan(perm=perm, inverse=inverse, chunk_sizes=cap)


@REBATCHERS.register("none")
def plan_none(target: torch.Tensor, num_devices: int,
              priority: torch.Tensor | None = None, scores: torch.Tensor | None = None
              ) -> RebatchPlan:
    """Vanilla TP: contiguous equal chunks by position, whatever the targets say (identity perm)."""
    target = _check(target, num_devices)
    ar = torch.arange(target.shape[0], device=target.device)
    return RebatchPlan(perm=ar, inverse=ar.clone(),
                       chunk_sizes=equal_chunks(target.shape[0], num_devices, target.device))


def rebatch(hidden: torch.Tensor, target: torch.Tensor, num_devices: int,
            strategy: str = "align", priority: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, RebatchPlan]:
    """Reorder a batch so that chunk g of the result goes to device g (Alg. 3 lines 1-8).

    hidden: [T, ...] any dtype (bf16 included), on any device; target: int[T] on the same device,
    the preferred device per token (-1 = no preference, see `choose_devices`).
    Returns (hidden[plan.perm]: [T, ...], plan); chunk g is rows [plan.offsets[g], plan.offsets[g+1]).
    """
    if hidden.dim() < 1 or hidden.shape[0] != target.shape[0]:
        raise InputError(f"hidden {tuple(hidden.shape)} and target {tuple(target.shape)} "
                         f"disagree on the number of tokens")
    plan = REBATCHERS.get(strategy)(target, num_devices, priority)
    return hidden.index_select(0, plan.perm), plan


def resume_tokens(x: torch.Tensor, plan: RebatchPlan) -> torch.Tensor:
    """Put a re-batched [T, ...] tensor back in the original token order (Alg. 3 lines 10-12).

    Exact inverse of `rebatch`: resumed[plan.perm[i]] = x[i], for any dtype.
    """
    if x.dim() < 1 or x.shape[0] != plan.perm.shape[0]:
        raise InputError(f"x has {tuple(x.shape)[:1]} rows, the plan {plan.perm.shape[0]}")
    return x.index_select(0, plan.inverse)


def local_fraction(plan: RebatchPlan, target: torch.Tensor) -> float:
    """Share of the tokens with a preference (target in [0, G)) that landed on their preferred
    device; NaN when no token has one. A reporting helper: it synchronises with the device."""
    target = target.long()
    has_pref = (target >= 0) & (target < plan.num_devices)
    n = int(has_pref.sum())
    if n == 0:
        return float("nan")
    return int(((plan.home_device() == target) & has_pref).sum()) / n
