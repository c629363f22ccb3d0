"""The tp token step of the `sempar` solver (placement/sempar/solver.py): each fit token to a
device, local activations maximised under tp mode's equal per-batch capacity.

tp mode cuts the request stream into batches of `BATCH` tokens and gives every device 1/G of each
batch (Sem-MoE Alg. 3's align step); the fit trace has no batches of its own, so `pseudo_batches`
cuts `SemparConfig.shuffles` seeded request orders into batches and `batch_priced_assign` prices
each batch's per-device capacity (Lagrangian). Shapes: U fit tokens, G devices, nb
pseudo-batches.
"""

from __future__ import annotations

import numpy as np

from sempar.affinity.affinity_stats import AffinityStats
from sempar.placement.capacity import BATCH
from sempar.placement.sempar.load import onehot


def pseudo_batches(stats: AffinityStats, seed: int, shuffles: int, batch: int = BATCH):
    """(occ CSR float64[U, nb], capacity float[nb]): occurrences of each fit token in each
    pseudo-batch. The fit requests are put in `shuffles` seeded random orders and each order is
    cut into batches of `batch` tokens like tp mode cuts a stream (capacity.BATCH); a device may
    take 1/G of a batch (the capacity returned is the batch size)."""
    from scipy import sparse

    rng = np.random.default_rng([seed, 0xBA7])
    req, tok = stats.request_index, stats.token_index
    order_in_req = np.argsort(req, kind="stable")
    starts = np.concatenate([[0], np.cumsum(stats.lengths)])
    rows, cols, sizes = [], [], []
    nb = 0
    for _ in range(shuffles):
        perm = rng.permutation(stats.R)
        seq = np.concatenate([order_in_req[starts[r]:starts[r + 1]] for r in perm])
        b = np.arange(seq.size) // batch
        rows.append(tok[seq])
        cols.append(nb + b)
        sizes.append(np.bincount(b))
        nb += int(b[-1]) + 1
    occ = sparse.csr_matrix((np.ones(sum(r.size for r in rows)), (np.concatenate(rows),
                             np.concatenate(cols))), shape=(stats.U, nb))
    occ.sum_duplicates()
    return occ, np.concatenate(sizes).astype(np.float64)


def batch_priced_assign(local: np.ndarray, occ, size: np.ndarray, shuffles: int,
                        price_steps: int, patience: int = 0) -> np.ndarray:
    """int64[U]: device of each token, tp mode's per-batch capacity priced in (Lagrangian).

    local float[U, G]: fit activations of token u on device d's experts; occ CSR[U, nb] and
    size float[nb] from `pseudo_batches`. Each device may take size[b] / G tokens of batch b;
    overflow is bumped by the evaluator to wherever room is left. Prices lam[b, d] >= 0 per
    occurrence; token u takes argmax_d local[u, d] - (occ @ lam)[u, d] / shuffles; prices rise
    with overflow (subgradient), `price_steps` times. Kept: the iterate with the best local
    activations minus the overflow, each overflowing occurrence valued at its device's mean
    local share. patience > 0: stop once that many price updates in a row found no better
    iterate (0: all `price_steps`).
    """
    U, G = local.shape
    cap = size[:, None] / G
    a = np.asarray(occ.sum(axis=1)).ravel() / shuffles
    per_occ = local / np.maximum(a, 1e-12)[:, None]
    lam = np.zeros((size.size, G))
    step = 0.1 * float(per_occ.max())
    best = None
    occT = occ.T.tocsr()
    for _ in range(price_steps):
        x = np.argmax(local - np.asarray(occ @ lam) / shuffles, axis=1)
        oh = onehot(x, G).astype(np.float64)
        m = np.asarray(occT @ oh)                                          # [nb, G]
        over = np.maximum(m - cap, 0.0)
        gain = local[np.arange(U), x]
        mean_share = np.bincount(x, weights=gain, minlength=G) / np.maximum(
            np.bincount(x, weights=a, minlength=G), 1e-12)
        value = gain.sum() - (over.sum(axis=0) / shuffles * mean_share).sum()
        if best is None or value > best[0]:
            best, stale = (value, x), 0
        else:
            stale += 1
            if patience and stale >= patience:
                break
        lam = np.maximum(0.0, lam + step * (m - cap) / cap)
        step *= 0.95
    return best[1]

