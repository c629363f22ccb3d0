"""Figures of a placement given where each token sits (design.md, Vocabulary and definitions).

`home[t, l]` is the device holding token t's hidden state when layer l's router runs. The
figures:

- **LAR** per layer: the share of (token, selected expert) activations whose expert has a
  replica on the token's home device.
- **node-local rate**: the same with "on the home device's node".
- **remote copies** (de-duplicated): per (token, layer) the number of distinct devices other
  than home that must receive the token, the nearest replica of each selected expert chosen
  (home, else a replica on home's node, else the lowest device id hosting it); reported per token
  per layer.
- **load**: activations each device computes, every activation served by the replica chosen as
  above; **imbalance** per layer = max / mean and max / median over devices.

Homes of the simple modes: `home_dp_round_robin` (requests dealt to DP ranks in arrival order,
equal counts per round) and `home_tp_contiguous` (per batch of `batch` tokens, equal contiguous
chunks: vanilla TP). `oracle_home` places tokens knowing their real routing (the ceiling).
"""

from __future__ import annotations

import numpy as np

from sempar.placement.placement import Placement
from sempar.predict.token_table import TokenTable

BATCH = 2048  # tokens per batch in tp mode (design.md)


def serving_device(placement: Placement, experts: np.ndarray, home: np.ndarray) -> np.ndarray:
    """int32[T, L, k]: the device whose replica serves each activation (nearest to home)."""
    hosts = placement.hosts()                                   # [L, G, N]
    T, L, k = experts.shape
    G = placement.num_devices
    node = placement.node_of
    out = np.empty((T, L, k), np.int32)
    for l in range(L):
        h = hosts[l][:, experts[:, l]]                          # [G, T, k]
        # rank devices: 0 = home, 1 = same node, 2 = elsewhere; then by id
        rank = np.where(np.arange(G)[:, None] == home[None, :, l], 0,
                        np.where(node[:, None] == node[home[:, l]][None, :], 1, 2))
        score = rank[:, :, None] * G + np.arange(G)[:, None, None]
        score = np.where(h, score, np.iinfo(np.int64).max)
        out[:, l] = score.argmin(axis=0)
    return out


def placement_figures(placement: Placement, experts: np.ndarray, home: np.ndarray) -> dict:
    """LAR, node-local rate, remote copies and load imbalance of `placement` with `home`.

    experts: int[T, L, k] (eval trace); home: int[T, L] device per token and layer.
    """
    serve = serving_device(placement, experts, home)
    local = serve == home[:, :, None]
    lar = local.mean(axis=(0, 2))
    node = placement.node_of
    node_local = (node[serve] == node[home][:, :, None]).mean(axis=(0, 2))
    srt = np.sort(np.where(local, -1, serve), axis=2)
    distinct = (srt >= 0) & np.concatenate([np.ones_like(srt[:, :, :1], bool),
                                            srt[:, :, 1:] != srt[:, :, :-1]], axis=2)
    copies = distinct.sum(axis=2)
    G, L = placement.num_devices, experts.shape[1]
    key = np.arange(L)[None, :, None] * G + serve
    load = np.bincount(key.ravel(), minlength=L * G).reshape(L, G).astype(float)
    mean = load.mean(axis=1)
    med = np.median(load, axis=1)
    return {"lar": lar, "lar_mean": float(lar.mean()), "lar_p50": float(np.median(lar)),
            "node_local_rate": float(node_local.mean()),
            "remote_copies_per_token": float(copies.mean()),
            "imbalance_max_mean": float((load.max(axis=1) / np.maximum(mean, 1e-12)).mean()),
            "imbalance_max_median": float((load.max(axis=1) / np.maximum(med, 1e-12)).mean()),
            "load": load}


def home_dp_round_robin(request_id: np.ndarray, num_devices: int, num_layers: int) -> np.ndarray:
    """int32[T, L]: request r-th in arrival order sits on DP rank r mod G, for every layer."""
    _, first = np.unique(request_id, return_index=True)
    order = np.argsort(first, kind="stable")                    # requests in arrival order
    rank_of = np.empty(order.size, np.int32)
    rank_of[order] = np.arange(order.size) % num_devices
    idx = np.unique(request_id, return_inverse=True)[1]
    return np.repeat(rank_of[idx][:, None], num_layers, axis=1)


def home_tp_contiguous(num_tokens: int, num_devices: int, num_layers: int,
                       batch: int = BATCH) -> np.ndarray:
    """int32[T, L]: within each batch, token i of n goes to device i * G // n (equal chunks)."""
    pos = np.arange(num_tokens)
    start = pos - pos % batch
    n = np.minimum(batch, num_tokens - start)
    dev = ((pos - start) * num_devices // n).astype(np.int32)
    return np.repeat(dev[:, None], num_layers, axis=1)


def oracle_home(placement: Placement, experts: np.ndarray, batch: int | None = BATCH) -> np.ndarray:
    """int32[T, L]: each (token, layer) on the device hosting most of its experts.

    With `batch`, every device takes an equal share of each batch (tp mode's align step): tokens
    are placed greedily in proposal rounds (each unplaced token asks its next-best device; a
    device with room takes the askers with the most local hits first).
    With batch=None the figure is unconstrained.
    """
    hosts = placement.hosts()
    T, L, k = experts.shape
    G = placement.num_devices
    home = np.empty((T, L), np.int32)
    for l in range(L):
        hits = hosts[l][:, experts[:, l]].sum(axis=2).T         # [T, G]
        if batch is None:
            home[:, l] = hits.argmax(axis=1)
            continue
        for lo in range(0, T, batch):
            h = hits[lo:lo + batch]
            n = h.shape[0]
            cap = np.full(G, n // G) + (np.arange(G) < n % G)
            pref = np.argsort(-h, axis=1, kind="stable")
            best = h.max(axis=1)
            assigned = np.full(n, -1, np.int32)
            # Proposal rounds: in round r every unplaced token asks its r-th best device; a
            # device with room takes its askers with the most local hits first.
            for r in range(G):
                idx = np.flatnonzero(assigned < 0)
                if idx.size == 0:
                    break
                choice = pref[idx, r]
                order = np.lexsort((-best[idx], choice))
                c = choice[order]
                rank = np.arange(c.size) - np.searchsorted(c, c, side="left")
                ok = rank < cap[c]
                assigned[idx[order[ok]]] = c[ok]
                cap -= np.bincount(c[ok], minlength=G)
            home[lo:lo + batch, l] = assigned
    return home


def home_tp_table(token_id: np.ndarray, table: TokenTable, num_devices: int,
                  batch: int = BATCH) -> np.ndarray:
    """int32[T, L]: tokens placed by a method's token table T[l, token] (confidence Tp), equal
    shares per device per batch (Sem-MoE Alg. 3's align step). In each batch the most confident
    tokens go first to their device while it has room; tokens the table does not know, and those
    whose device is full, fill the remaining room in order (our fallback)."""
    table = TokenTable.from_json(table)
    known, dev, conf = table.token_id, table.device, table.confidence   # [U], [L, U], [L, U]
    L = dev.shape[0]
    pos = np.searchsorted(known, token_id)
    pos = np.minimum(pos, known.size - 1)
    seen = known[pos] == token_id
    T, G = token_id.size, num_devices
    home = np.empty((T, L), np.int32)
    for l in range(L):
        want = np.where(seen, dev[l, pos], -1)
        score = np.where(seen, conf[l, pos], -1.0)
        for lo in range(0, T, batch):
            w, sc = want[lo:lo + batch], score[lo:lo + batch]
            n = w.size
            cap = np.full(G, n // G) + (np.arange(G) < n % G)
            got = np.full(n, -1, np.int32)
            order = np.lexsort((-sc, w))                          # by device, most confident first
            ww = w[order]
            rank = np.arange(n) - np.searchsorted(ww, ww, side="left")
            ok = (ww >= 0) & (rank < cap[np.maximum(ww, 0)])
            got[order[ok]] = ww[ok]
            cap -= np.bincount(ww[ok], minlength=G)
            rest = np.flatnonzero(got < 0)
            got[rest] = np.repeat(np.arange(G), cap)[: rest.size]
            home[lo:lo + batch, l] = got
    return home


def home_dp_table(request_id: np.ndarray, token_id: np.ndarray, table: TokenTable, num_devices: int,
                  num_layers: int) -> np.ndarray:
    """int32[T, L]: requests (arrival order) to DP ranks by a token table: each request's score
    per rank sums its known tokens' confidences over layers; in each round of G requests a rank
    that has taken one is masked until all have (Sem-MoE Alg. 2's round mask)."""
    table = TokenTable.from_json(table)
    known, dev, conf = table.token_id, table.device, table.confidence   # [U], [L, U], [L, U]
    G = num_devices
    pos = np.minimum(np.searchsorted(known, token_id), known.size - 1)
    seen = known[pos] == token_id
    reqs, first, ridx = np.unique(request_id, return_index=True, return_inverse=True)
    score = np.zeros((reqs.size, G))
    for l in range(dev.shape[0]):
        np.add.at(score, (ridx[seen], dev[l, pos[seen]]), conf[l, pos[seen]])
    rank = np.empty(reqs.size, np.int32)
    mask = np.ones(G, bool)
    for r in np.argsort(first, kind="stable"):
        g = int(np.argmax(np.where(mask, score[r], -np.inf)))
        rank[r] = g
        mask[g] = False
        if not mask.any():
            mask[:] = True
    return np.repeat(rank[ridx][:, None], num_layers, axis=1)
