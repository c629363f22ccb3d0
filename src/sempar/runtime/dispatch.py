"""Counted collectives and the expert-parallel dispatch / combine (s-MoE §4, Sem-MoE §3.4).

`Comm` wraps the process group. Every collective goes through `all_to_all_v` (torch's
`all_to_all_single` with uneven splits), so the bytes each rank sends to each other rank are
known exactly and recorded in `Comm.bytes[(layer, collective)]`: int64[G] (this rank's row:
bytes to each destination; the diagonal, a rank's copy to itself, is never counted).

Collectives (names used as counter keys):

- `sizes`: the int64 row counts a receiver needs to size its buffer before an all2allv
  (8 bytes per pair). The simulator's one-shot mode has no metadata collective: this exchange is
  the runtime's only extra (G - 1) * 8 bytes per rank per all2allv with unknown sizes.
- `dispatch`: one-shot packets, one row per (token, destination device) (de-duplication,
  s-MoE §4 (c)): float32[rows, H + 2k (+1)] = [activation | k expert ids (int32 bits) |
  k routing weights (| exflow: global token index, int32 bits)]: 4H + 8k bytes per copy, the
  simulator's `token_bytes + k * meta_bytes` with dtype_bytes 4 and meta_bytes 8.
- `combine`: one partial sum float32[H] per copy (the weighted sum of the experts the
  destination served), back to the home (or, exflow, to the top-1 expert's device).
- `allreduce` = direct reduce-scatter + all-gather, `reduce-scatter`, `all-gather` (attention TP):
  direct all-to-all algorithms, not rings: per rank the same bytes as a ring ((G - 1) X / G for
  RS and AG with equal chunks), spread over all peers instead of the ring successor.
- `prerouting` (tp-exact): the all-reduce (direct RS + AG) of the float32[T, N] partial router
  logits, 2 (G - 1) / G of T x N x 4 bytes per rank, as the simulator's `smoe-exact` ring.
- `context-ag` (exflow), `output` (final hidden states gathered on rank 0).

The receiver of a dispatch recomputes which of the k experts it serves from the ids and the
sender's rank: serve[src, e] (the replica table every rank holds), so the packets carry no
per-destination masks. Every collective failure becomes `RankFailure` naming rank, collective
and layer.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

from sempar.placement import serving as placement_serving
from sempar.runtime.dist import RankFailure
from sempar.runtime.experts import LocalExperts


class Comm:
    """Rank, world size, device, timeout and the byte counters of one process."""

    def __init__(self, rank: int, world: int, device: torch.device, timeout: float = 30.0):
        self.rank, self.world, self.device, self.timeout = rank, world, device, timeout
        self.bytes: dict[tuple[int, str], np.ndarray] = defaultdict(
            lambda: np.zeros(world, np.int64))
        self.calls: dict[tuple[int, str], int] = defaultdict(int)

    def _count(self, layer: int, name: str, per_dst: list[int]) -> None:
        row = self.bytes[(layer, name)]
        for d, b in enumerate(per_dst):
            if d != self.rank:
                row[d] += int(b)
        self.calls[(layer, name)] += 1

    def _a2a(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int] | None,
             in_splits: list[int] | None, layer: int, name: str) -> None:
        try:
            dist.all_to_all_single(out, inp, out_splits, in_splits)
        except Exception as err:  # gloo raises RuntimeError / DistBackendError
            raise RankFailure(
                f"rank {self.rank}: collective '{name}' at layer {layer} failed (a peer rank "
                f"died or hung; timeout {self.timeout:g} s): {str(err).splitlines()[0]}") from None

    def exchange_sizes(self, counts: list[int], layer: int) -> list[int]:
        """All2all of one int64 per pair: what each rank will send me."""
        if self.world == 1:
            return list(counts)
        send = torch.tensor(counts, dtype=torch.int64, device=self.device)
        recv = torch.empty_like(send)
        self._a2a(recv, send, None, None, layer, "sizes")
        self._count(layer, "sizes", [8] * self.world)
        return [int(c) for c in recv.tolist()]

    def all_to_all_v(self, send: torch.Tensor, send_rows: list[int], layer: int, name: str,
                     recv_rows: list[int] | None = None) -> tuple[torch.Tensor, list[int]]:
        """send: [sum(send_rows), D] rows grouped by destination rank; returns ([rows, D],
        rows from each source). recv_rows: known receive sizes (skips the `sizes` exchange)."""
        if recv_rows is None:
            recv_rows = self.exchange_sizes(send_rows, layer)
        D = int(np.prod(send.shape[1:])) if send.dim() > 1 else 1
        recv = torch.empty((sum(recv_rows),) + tuple(send.shape[1:]), dtype=send.dtype,
                           device=send.device)
        if self.world > 1:
            self._a2a(recv, send.contiguous(), recv_rows, send_rows, layer, name)
        else:
            recv.copy_(send)
        self._count(layer, name, [r * D * send.element_size() for r in send_rows])
        return recv, recv_rows

    def all_gather_v(self, x: torch.Tensor, layer: int, name: str,
                     rows: list[int] | None = None) -> tuple[torch.Tensor, list[int]]:
        """Every rank's x concatenated in rank order; rows: each rank's rows if known."""
        G = self.world
        send = x.repeat((G,) + (1,) * (x.dim() - 1))
        out, got = self.all_to_all_v(send, [x.shape[0]] * G, layer, name, rows)
        return out, got

    def reduce_scatter_v(self, x: torch.Tensor, chunks: list[int], layer: int,
                         name: str) -> torch.Tensor:
        """x: [sum(chunks), D] partial sums on every rank; returns this rank's chunk summed over
        ranks in rank order (every rank gets bitwise the same sums)."""
        mine = chunks[self.rank]
        recv, _ = self.all_to_all_v(x, chunks, layer, name, [mine] * self.world)
        return recv.view(self.world, mine, *x.shape[1:]).sum(0) if mine else recv[:0]

    def all_reduce(self, x: torch.Tensor, layer: int, name: str = "allreduce") -> torch.Tensor:
        """Direct reduce-scatter then all-gather over equal row chunks of x [T, D]."""
        T = x.shape[0]
        base, extra = divmod(T, self.world)
        chunks = [base + (1 if g < extra else 0) for g in range(self.world)]
        part = self.reduce_scatter_v(x, chunks, layer, name)
        out, _ = self.all_gather_v(part, layer, name, chunks)
        return out


def serving_table(placement, layer: int, device: torch.device) -> torch.Tensor:
    """int64[G, N] on `device`: the device whose replica serves expert e for a token homed on g
    (`placement.serving.serving_table`, the evaluator's rule: home, then the same node, then the
    lowest device id)."""
    return torch.from_numpy(placement_serving.serving_table(placement, layer)).to(device)


def pack(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor,
         gid: torch.Tensor | None = None) -> torch.Tensor:
    """float32[n, H + 2k (+1)]: [x | ids as int32 bits | w (| gid as int32 bits)]."""
    cols = [x.float(), ids.to(torch.int32).view(torch.float32), w.float()]
    if gid is not None:
        cols.append(gid.to(torch.int32).view(torch.float32)[:, None])
    return torch.cat(cols, dim=1)


def unpack(p: torch.Tensor, H: int, k: int, with_gid: bool = False):
    x = p[:, :H]
    ids = p[:, H:H + k].contiguous().view(torch.int32).long()
    w = p[:, H + k:H + 2 * k]
    gid = p[:, H + 2 * k:H + 2 * k + 1].contiguous().view(torch.int32).long()[:, 0] \
        if with_gid else None
    return x, ids, w, gid


def ep_moe(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, serve: torch.Tensor,
           experts: LocalExperts, comm: Comm, layer: int) -> torch.Tensor:
    """Expert-parallel MoE of this rank's tokens, outputs back home (attn-dp, sglang-ep, TP).

    x: float32[n, H] MoE inputs; ids: int64[n, k]; w: float32[n, k] routing weights (router
    output, unchanged); serve: int64[G, N] serving table. Returns float32[n, H] = sum_j w_j E_j(x).
    One dispatch all2allv (one row per token and remote device) and one combine all2allv.
    """
    me, G = comm.rank, comm.world
    n, H = x.shape
    k = ids.shape[1]
    dev = serve[me][ids] if n else ids                              # [n, k]
    out = experts.apply(x, ids, w, dev == me)
    idx = [(dev == d).any(1).nonzero()[:, 0] if d != me else ids.new_zeros(0)
           for d in range(G)]
    sel = torch.cat(idx)
    send = pack(x[sel], ids[sel], w[sel])
    recv, rrows = comm.all_to_all_v(send, [int(i.numel()) for i in idx], layer, "dispatch")
    rx, rids, rw, _ = unpack(recv, H, k)
    src = torch.repeat_interleave(torch.arange(G, device=x.device),
                                  torch.tensor(rrows, device=x.device))
    rmask = serve[src[:, None], rids] == me if rids.numel() else rids.bool()
    partial = experts.apply(rx, rids, rw, rmask)
    back, _ = comm.all_to_all_v(partial, rrows, layer, "combine",
                                [int(i.numel()) for i in idx])
    return out.index_add_(0, sel, back)


def ep_moe_chained(x: torch.Tensor, gid: torch.Tensor, ids: torch.Tensor, w: torch.Tensor,
                   serve: torch.Tensor, experts: LocalExperts, comm: Comm, layer: int,
                   norm) -> tuple[torch.Tensor, torch.Tensor]:
    """ExFlow's context-coherent EP layer (ExFlow §IV-A): one dispatch; the token then stays on
    the device of its top-1 expert, where the other experts' partial sums are sent.

    x: float32[n, H] residual stream after attention (pre-norm: the destination applies `norm`,
    the post-attention RMSNorm, so the top-1 device can add the residual); gid: int64[n] global
    token index; ids, w: [n, k]. Returns (y float32[m, H] = x + MoE(norm(x)), gid int64[m]) for
    the m tokens whose top-1 expert this rank serves, ordered by (previous rank, its order).

    Every rank lays the tokens it sees out in one view V (blocks by source rank; its own tokens
    in its own block), and p's partial sums to q come in V order, which q can rebuild from the
    ids it received: the combine needs no metadata and no size exchange.
    """
    me, G = comm.rank, comm.world
    n, H = x.shape
    k = ids.shape[1]
    dev = serve[me][ids] if n else ids
    idx = [(dev == d).any(1).nonzero()[:, 0] if d != me else ids.new_zeros(0)
           for d in range(G)]
    sel = torch.cat(idx)
    send = pack(x[sel], ids[sel], w[sel], gid[sel])
    recv, rrows = comm.all_to_all_v(send, [int(i.numel()) for i in idx], layer, "dispatch")
    rx, rids, rw, rgid = unpack(recv, H, k, with_gid=True)
    # the view V: source blocks in rank order, this rank's own tokens as block `me`
    starts = np.concatenate([[0], np.cumsum(rrows)])
    blocks = []
    for s in range(G):
        if s == me:
            blocks.append((x, ids, w, gid, torch.full((n,), me, device=x.device)))
        else:
            a, b = int(starts[s]), int(starts[s + 1])
            blocks.append((rx[a:b], rids[a:b], rw[a:b], rgid[a:b],
                           torch.full((b - a,), s, device=x.device)))
    vx, vids, vw, vgid, vsrc = (torch.cat([b[i] for b in blocks]) for i in range(5))
    vdev = serve[vsrc[:, None], vids] if vids.numel() else vids    # [V, k]
    mine = vdev == me
    partial = experts.apply(norm(vx), vids, vw, mine)
    top = vdev[:, 0] if vids.numel() else vsrc
    send_idx = [((top == p) & mine.any(1)).nonzero()[:, 0] if p != me else vsrc.new_zeros(0)
                for p in range(G)]
    recv_idx = [((top == me) & (vdev == p).any(1)).nonzero()[:, 0] if p != me
                else vsrc.new_zeros(0) for p in range(G)]
    back, _ = comm.all_to_all_v(partial[torch.cat(send_idx)], [int(i.numel()) for i in send_idx],
                                layer, "combine", [int(i.numel()) for i in recv_idx])
    keep = top == me
    y = vx + partial
    y = y.index_add_(0, torch.cat(recv_idx), back)
    return y[keep], vgid[keep]
