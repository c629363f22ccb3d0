"""The collectives of an MoE layer as bytes per directed device pair (s-MoE §3.2, CAMoE eq. 9).

Ring collectives (s-MoE §3.2, Preliminary 1). On G devices in ring order (device ids: nodes are
contiguous, so the ring crosses each node boundary once), for a buffer of X bytes:

- all-reduce (AR): 2(G - 1) steps of X / G bytes: each device sends 2(G - 1) X / G to its successor;
- reduce-scatter (RS) and all-gather (AG): G - 1 steps, (G - 1) X / G per device.

Their time is steps x the slowest ring edge's alpha + beta * X / G (every step waits for the
slowest edge), with the `dispatch` link parameters.

All-to-all (Preliminary 2 and CAMoE eq. 9): copies per directed pair counted from the real
routing: `pair_counts` turns src int[T] and dst int[T, k] into int64[batches, G, G] with
`np.bincount` over keys batch * G^2 + src * G + dst, never a loop over tokens. Without
de-duplication every (token, expert) whose serving device is not the token's home is one copy
(DeepSpeed-MoE, Tutel); with de-duplication a token goes once to each distinct remote device
(s-MoE §4 (c), DeepEP), and the combine returns one partial sum per device.
"""

from __future__ import annotations

import numpy as np

from sempar.comm.topology import Topology

RING_STEPS = {"AR": lambda G: 2 * (G - 1), "RS": lambda G: G - 1, "AG": lambda G: G - 1}


def ring_volume(kind: str, G: int, nbytes: float) -> float:
    """Bytes each device sends in a ring `kind` over a buffer of `nbytes` (s-MoE Prelim. 1)."""
    return RING_STEPS[kind](G) * nbytes / G


def ring_pairs(kind: str, G: int, nbytes: float) -> np.ndarray:
    """float64[G, G]: bytes each device sends to its ring successor (g -> g + 1 mod G)."""
    out = np.zeros((G, G))
    if G > 1:
        out[np.arange(G), (np.arange(G) + 1) % G] = ring_volume(kind, G, nbytes)
    return out


def ring_seconds(topo: Topology, kind: str, nbytes: np.ndarray) -> np.ndarray:
    """float64[...]: time of a ring `kind` over buffers of `nbytes` (one per batch):
    steps x max over ring edges of alpha + beta * nbytes / G (dispatch parameters)."""
    G = topo.num_devices
    nbytes = np.asarray(nbytes, dtype=np.float64)
    if G == 1:
        return np.zeros_like(nbytes)
    src, dst = np.arange(G), (np.arange(G) + 1) % G
    a, b = topo.alpha[1, src, dst], topo.beta[1, src, dst]
    step = (a[None, :] + b[None, :] * (nbytes.reshape(-1, 1) / G)).max(axis=1)
    return (RING_STEPS[kind](G) * step).reshape(nbytes.shape) * (nbytes > 0)


def dedup_targets(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """int[T, k]: `dst` with every repeated device of a row replaced by the row's `src`, so that
    counting pairs off the diagonal counts each distinct remote device once (row order lost)."""
    s = np.sort(dst, axis=1)
    dup = np.zeros(s.shape, bool)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    return np.where(dup, src[:, None].astype(s.dtype), s)


def pair_counts(src: np.ndarray, dst: np.ndarray, batch_base: np.ndarray, num_batches: int,
                G: int, reverse: bool = False) -> np.ndarray:
    """int64[batches, G, G]: copies sent from src[t] to each dst[t, j] != src[t], per batch.

    src: int[T]; dst: int[T, k] (or int[T]); batch_base: int[T] = batch index * G * G.
    reverse: count dst -> src instead (the combine of a dispatch)."""
    src = src.astype(np.int32, copy=False)
    dst = dst.astype(np.int32, copy=False)
    if dst.ndim == 1:
        dst = dst[:, None]
    if reverse:
        key = (batch_base + src)[:, None] + dst * G
    else:
        key = (batch_base + src * G)[:, None] + dst
    c = np.bincount(key.ravel(), minlength=num_batches * G * G).reshape(num_batches, G, G)
    c[:, np.arange(G), np.arange(G)] = 0
    return c


def _bits_dtype(G: int):
    return np.uint8 if G <= 8 else np.uint16 if G <= 16 else np.uint32 if G <= 32 else np.uint64


def _device_bits(serve: np.ndarray, G: int) -> np.ndarray:
    """uint[T]: bitmask of the devices in each row of serve int[T, k]."""
    dt = _bits_dtype(G)
    x = np.left_shift(dt(1), serve.astype(dt))
    if dt == np.uint8 and x.shape[1] == 8:                      # OR the 8 bytes of a uint64
        y = x.view(np.uint64).ravel()
        for sh in (32, 16, 8):
            y = y | (y >> np.uint64(sh))
        return (y & np.uint64(255)).astype(np.uint8)
    return np.bitwise_or.reduce(x, axis=1)


def route_counts(src: np.ndarray, experts: np.ndarray, table: np.ndarray, by_home: bool,
                 batch: np.ndarray, num_batches: int, G: int, dedup: bool = True,
                 lookup: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Copies of one layer's dispatch, per batch and directed pair, from the token level.

    src: int32[T] homes; experts: int[T, k]; table: int[N] device of each expert (by_home False)
    or int[G, N] the replica serving each expert for each home (by_home True); batch: int[T].
    Returns (copies int64[B, G, G] without de-duplication, copies with de-duplication (None if
    not asked), activations served on the home device). Vectorised: one bincount over keys
    (batch, home, serving device) for all copies; the de-duplicated count
    from each token's bitmask of serving devices, histogrammed by (batch, home, bitmask) for
    G <= 10, else one bincount per device; never a loop over tokens. lookup: int[T] the device
    whose nearest replicas serve (default src; ExFlow's partial combine sends from the replicas
    chosen for the token's home to its next device)."""
    T, k = experts.shape
    experts = np.ascontiguousarray(experts)              # strided gathers cost 3x
    bs = batch.astype(np.int64) * G + src                        # batch * G + home
    table = np.asarray(table)
    small = table.astype(np.uint8 if G <= 256 else np.int32)
    serve = small[(src if lookup is None else lookup)[:, None], experts] if by_home else small[experts]
    cnt = np.bincount(((bs * G)[:, None] + serve).ravel(),
                      minlength=num_batches * G * G).reshape(num_batches, G, G)
    diag = np.arange(G)
    local = int(cnt[:, diag, diag].sum())
    cnt[:, diag, diag] = 0
    dd = None
    if dedup:
        if G > 64:
            dd = pair_counts(src, dedup_targets(src, serve), (batch * G * G).astype(np.int64),
                             num_batches, G)
        else:
            bits = _device_bits(serve, G)
            if G <= 10:
                P = 1 << G
                h = np.bincount(bs * P + bits, minlength=num_batches * G * P)
                h = h.reshape((num_batches * G,) + (2,) * G)     # axis G - d: bit d
                axes = set(range(1, G + 1))
                dd = np.stack([h.sum(axis=tuple(axes - {G - d}))[:, 1] for d in range(G)],
                              axis=1).reshape(num_batches, G, G)
            else:
                dt = bits.dtype.type
                dd = np.empty((num_batches * G, G), np.int64)
                for d in range(G):
                    dd[:, d] = np.bincount(bs[((bits >> dt(d)) & dt(1)).astype(bool)],
                                           minlength=num_batches * G)
                dd = dd.reshape(num_batches, G, G)
            dd[:, diag, diag] = 0
    return cnt, dd, local


def all_to_all_volume(counts: np.ndarray, per_copy: float, header: float = 0.0,
                      every_pair: bool = False) -> np.ndarray:
    """float64[..., G, G]: bytes per pair = copies x per_copy (+ header where anything is sent,
    or on every off-diagonal pair with every_pair)."""
    b = counts * float(per_copy)
    if header:
        G = counts.shape[-1]
        off = ~np.eye(G, dtype=bool)
        mask = off if every_pair else (counts > 0)
        b = b + header * mask
    return b


def size_exchange(num_batches: int, G: int, nbytes: float) -> np.ndarray:
    """float64[B, G, G]: `nbytes` on every directed pair off the diagonal, per batch: the row
    count a receiver needs to size its buffer before an all-to-all-v whose receive sizes it does
    not know (our runtime: one int64 per pair, `runtime.dispatch.Comm.exchange_sizes`)."""
    out = np.full((num_batches, G, G), float(nbytes))
    out[:, np.arange(G), np.arange(G)] = 0.0
    return out


def gather_held(held: np.ndarray, batch: np.ndarray, num_batches: int, G: int,
                row_bytes: float) -> np.ndarray:
    """float64[B, G, G]: an all-gather of uneven blocks: every device sends `row_bytes` per token
    it holds to each other device. held: int[T] the device holding each token; batch: int[T]."""
    n = np.bincount(np.asarray(batch, np.int64) * G + held, minlength=num_batches * G)
    out = np.repeat((n.reshape(num_batches, G) * float(row_bytes))[:, :, None], G, axis=2)
    out[:, np.arange(G), np.arange(G)] = 0.0
    return out
