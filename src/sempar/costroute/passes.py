"""One pass of a cost-routing sweep: every batch of the text through the model with the gate-bias
hook, capturing routing and LM quality, and the figures of one lambda (protocol: `routing.sweep`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from sempar.errors import InputError
from sempar.costroute.cost_bias import TokenBytes, a2a_layer_seconds, dispatch_counts, link_cost_share
from sempar.costroute.hook import CostRoutingHook
from sempar.costroute.metrics import device_imbalance, routing_shift
from sempar.costroute.text import Sequences


@dataclass
class PassResult:
    """One lambda over all batches: routing (experts int16[T, L, k], home int8[T], batch int32[T]),
    counts int64[L, E], and per-domain quality sums (nll, correct, predicted tokens)."""

    experts: np.ndarray
    home: np.ndarray
    batch: np.ndarray
    full_batches: int
    counts: np.ndarray
    nll: np.ndarray
    correct: np.ndarray
    predicted: np.ndarray


def run_pass(model: Any, seqs: Sequences, hook: CostRoutingHook, num_devices: int,
             batch_size: int, progress: Callable[[int], Any] | None = None) -> PassResult:
    """Run every batch through `model` with `hook` active; capture routing and LM quality."""
    import torch

    from sempar.trace.routers import RoutingCapture, trace_meta_for

    meta = trace_meta_for(model, hook.sites, "sweep")
    L, E, k = meta.num_layers, meta.num_experts, meta.top_k
    D = len(seqs.domains)
    nll, correct, predicted = np.zeros(D), np.zeros(D), np.zeros(D)
    counts = np.zeros((L, E), np.int64)
    ex_parts, home_parts, batch_parts = [], [], []
    pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
    n = len(seqs.tokens)
    full = 0
    with hook, RoutingCapture(hook.sites, k, E) as cap, torch.no_grad():
        for bi, lo in enumerate(range(0, n, batch_size)):
            batch = seqs.tokens[lo:lo + batch_size]
            B, S = len(batch), max(t.size for t in batch)
            full += int(B == batch_size)
            ids = np.full((B, S), pad_id, np.int64)
            mask = np.zeros((B, S), bool)
            for b, t in enumerate(batch):
                ids[b, :t.size], mask[b, :t.size] = t, True
            homes = np.repeat(np.arange(B) % num_devices, S)
            hook.set_sources(homes)
            cap.expect(B * S)
            out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                        use_cache=False)
            experts, _ = cap.take()
            keep = mask.reshape(-1)
            ex = experts[keep]
            ex_parts.append(ex.astype(np.int16))
            home_parts.append(homes[keep].astype(np.int8))
            batch_parts.append(np.full(ex.shape[0], bi, np.int32))
            for l in range(L):
                counts[l] += np.bincount(ex[:, l, :].ravel(), minlength=E)
            logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
            target = torch.from_numpy(ids[:, 1:])
            valid = mask[:, 1:] & mask[:, :-1]
            tok_nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1).numpy()
            hit = (logp.argmax(-1) == target).numpy()
            for b in range(B):
                d = seqs.domain[lo + b]
                v = valid[b]
                nll[d] += float(tok_nll[b][v].sum())
                correct[d] += float(hit[b][v].sum())
                predicted[d] += float(v.sum())
            if progress is not None:
                progress(int(mask.sum()))
    return PassResult(np.concatenate(ex_parts), np.concatenate(home_parts),
                      np.concatenate(batch_parts), full, counts, nll, correct, predicted)


def per_batch_counts(res: PassResult, dest: np.ndarray, batch_size: int, dedup: bool) -> np.ndarray:
    """float64[full batches, L, G, G] dispatch counts of the full batches (eq. 10 per forward)."""
    out = []
    for b in range(res.full_batches):
        sel = res.batch == b
        out.append(dispatch_counts(res.experts[sel], res.home[sel], dest, dedup))
    if not out:
        raise InputError(f"fewer sequences than one batch of {batch_size}: lower --batch-size "
                         "or raise --tokens-per-domain")
    return np.stack(out)


# --------------------------------------------------------------------------- figures

def point_figures(lam: float, res: PassResult, base: PassResult, topology: Any, hosts: np.ndarray,
                  dest: np.ndarray, nbytes: TokenBytes, batch_size: int, dedup: bool,
                  domains: list[str]) -> dict[str, Any]:
    """Every figure of one lambda (absolute; changes are filled in by `finish`)."""
    n = per_batch_counts(res, dest, batch_size, dedup)                  # [F, L, G, G]
    t = a2a_layer_seconds(topology, n, nbytes)
    total = t["total"]                                                   # [F, L]
    layers = [{"layer": l, "a2a_mean_s": float(total[:, l].mean()),
               "a2a_p95_s": float(np.percentile(total[:, l], 95))} for l in range(total.shape[1])]
    all_n = n.sum(axis=0)
    quality = {d: {"ppl": float(np.exp(res.nll[i] / max(res.predicted[i], 1))),
                   "acc": float(res.correct[i] / max(res.predicted[i], 1)),
                   "tokens": int(res.predicted[i])} for i, d in enumerate(domains)}
    out = {"lambda": float(lam),
           "a2a_mean_s": float(total.mean()), "a2a_p95_s": float(np.percentile(total, 95)),
           "phases_mean_s": {p: float(t[p].mean()) for p in ("metadata", "dispatch", "combine")},
           "layers": layers,
           "local_rate": float(np.trace(all_n, axis1=-2, axis2=-1).sum() / max(all_n.sum(), 1)),
           "expensive_link_share": link_cost_share(topology, all_n, nbytes),
           "imbalance_max_mean": device_imbalance(res.counts, hosts),
           "quality": quality,
           "ppl_mean": float(np.mean([q["ppl"] for q in quality.values()])),
           "acc_mean": float(np.mean([q["acc"] for q in quality.values()]))}
    out.update(routing_shift(res.counts, base.counts))
    return out
