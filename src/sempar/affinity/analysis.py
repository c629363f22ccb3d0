"""`sempar analyze`: every affinity statistic of a trace, in the JSON of the command-line contract.

Composes token_stats (Sem-MoE Table 1, kurtosis), transitions (inter-layer affinity, look-back
prediction), requests (request activation vectors by domain) and load (per-batch long tail).
Arrays the plots need are kept on the result; `to_json()` gives the contract
(docs/design.md: `analyze --json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from sempar.affinity import load, requests, affinity_stats, token_stats, transitions
from sempar.errors import InputError
from sempar.trace.ops import split_by_request, split_by_token
from sempar.trace.schema import RoutingTrace

FIT_FRACTION = 0.25      # Sem-MoE A.2: 25% of the profile fits the static top-k
MAX_LOOKBACK = 5
MAX_REQUESTS_EMBEDDED = 1500


@dataclass
class TraceAnalysis:
    """Result of `analyze_trace`; `to_json()` is the `analyze --json` contract."""

    info: dict
    layers: list[dict]
    lookback_expert: list[float | None]
    lookback_device: list[float | None]
    devices: int
    transition_layers: list[tuple[int, int]]          # (l, l+1) pairs drawn as heatmaps
    transition_expert: list[np.ndarray]               # float64[N, N] each
    transition_device: list[np.ndarray]               # float64[G, G] each
    topk_mass: list[float]                            # per adjacent layer pair
    kurtosis_mid: np.ndarray                          # float64[tokens], middle layer
    embedding: requests.RequestEmbedding | None
    long_tail: dict[int, dict]
    sampled: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        def mean_of(key: str) -> float | None:
            return _mean_or_none([l[key]["p50"] for l in self.layers])

        k, N = self.info["top_k"], self.info["experts"]
        return {
            "trace": self.info,
            "layers": self.layers,
            "summary": {
                "f1_p50_mean": mean_of("f1"),
                "f1_mean": _mean_or_none([l["f1_mean"] for l in self.layers]),
                "cum_hotness_topk_p50_mean": mean_of("cum_hotness_topk"),
                "max_hotness_non_topk_p50_mean": mean_of("max_hotness_non_topk"),
                "kurtosis_p50_mean": _mean_or_none([l["kurtosis_p50"] for l in self.layers]),
                "lookback_accuracy": self.lookback_expert,
                "lookback_accuracy_device": self.lookback_device,
                "devices": self.devices,
                "transition_topk_mass_mean": float(np.mean(self.topk_mass)) if self.topk_mass else None,
                "transition_uniform": k / N,
            },
            "requests": None if self.embedding is None else
            self.embedding.summary(self.info.get("domain_names", [])),
            "load_tail": {str(B): {key: v for key, v in d.items() if key != "sorted_load"}
                          for B, d in self.long_tail.items()},
            "sampled": self.sampled,
        }


def _mean_or_none(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _subsample(trace: RoutingTrace, max_tokens: int, seed: int) -> tuple[RoutingTrace, dict]:
    """Whole requests, drawn at random, up to about `max_tokens` tokens (the trace if smaller)."""
    if trace.num_tokens <= max_tokens:
        return trace, {}
    frac = max_tokens / trace.num_tokens
    part, _ = split_by_request(trace, fit_fraction=min(max(frac, 1e-6), 0.999), seed=seed)
    return part, {"from_tokens": trace.num_tokens, "tokens": part.num_tokens,
                  "note": "analysed a random subset of whole requests"}


def analyze_trace(trace: RoutingTrace, devices: int = 8, seed: int = 0,
                  max_tokens: int = 1_000_000, min_occurrences: int = 2,
                  embed: bool = True,
                  progress: Callable[[str], None] | None = None) -> TraceAnalysis:
    """All statistics of `sempar analyze` (see the module docstrings for each definition).

    devices: G of the contiguous layout used for the device-level figures.
    """
    step = progress or (lambda _msg: None)
    if trace.num_tokens < 8:
        raise InputError(f"trace: {trace.num_tokens} tokens are too few to analyse (need >= 8)")
    N, L, k = trace.meta.num_experts, trace.meta.num_layers, trace.meta.top_k
    if not 1 <= devices <= N:
        raise InputError(f"--ep: {devices} is not between 1 and the {N} experts")
    info = trace.info()
    info["domain_names"] = list(trace.domains)
    trace, sampled = _subsample(trace, max_tokens, seed)
    uniq, tok = np.unique(trace.token_id, return_inverse=True)
    fit, _ = split_by_token(trace, FIT_FRACTION, seed)

    step("Table 1: static top-k, hotness, kurtosis")
    layers, kurt_mid = [], np.zeros(0)
    for l in range(L):
        res = token_stats.table1_layer(tok, trace.experts[:, l], fit, uniq.size, N, min_occurrences)
        layers.append(res.summary(trace.meta.layers[l]))
        if l == L // 2:
            kurt_mid = res.kurtosis[np.isfinite(res.kurtosis)]

    step("inter-layer affinity and look-back prediction")
    # The look-back predictors follow the top-1 path (slot 0): a trace in an engine's unsorted
    # top-k order (metadata.slots_sorted false) has no top-1 path, so its look-back figures
    # are left out (None, with the reason in info) and device ties go to the lowest id.
    sorted_slots = trace.meta.slots_sorted
    top1 = trace.experts[:, :, 0].astype(np.int32)
    lb_expert = transitions.lookback_accuracy(top1, trace.experts, N, fit, MAX_LOOKBACK) \
        if sorted_slots else [None] * MAX_LOOKBACK
    if not sorted_slots:
        info["lookback"] = ("not computed: the trace's slots are in its engine's unsorted "
                            "top-k order (slots_sorted false), so slot 0 is not the top-1 expert")
    device_of = transitions.contiguous_devices(N, devices)
    hosts = affinity_stats.layout_hosts(device_of, devices, L)
    dev = affinity_stats.device_states(trace.experts, hosts,
                                      ties="top1" if sorted_slots else "lowest").astype(np.int32)
    lb_device = transitions.lookback_accuracy(dev, dev[:, :, None], devices, fit, MAX_LOOKBACK)
    masses = [transitions.topk_mass(transitions.pair_counts(trace.experts[:, l],
                                                            trace.experts[:, l + 1], N), k)
              for l in range(L - 1)]
    pairs = sorted({(l, l + 1) for l in (0, (L - 1) // 2, L - 2) if L >= 2})
    t_exp = [transitions.transition_matrix(trace.experts[:, a], trace.experts[:, b], N)
             for a, b in pairs]
    dev_sel = device_of[trace.experts]
    t_dev = [transitions.transition_matrix(dev_sel[:, a], dev_sel[:, b], devices) for a, b in pairs]

    embedding = None
    if embed and trace.domain is not None:
        step("request activation vectors by domain")
        reqs, vecs = requests.activation_vectors(trace.request_id, trace.experts, N)
        if reqs.size > MAX_REQUESTS_EMBEDDED:
            pick = np.sort(np.random.default_rng(seed).choice(reqs.size, MAX_REQUESTS_EMBEDDED,
                                                              replace=False))
            reqs, vecs = reqs[pick], vecs[pick]
        first_row = np.unique(trace.request_id, return_index=True)[1]
        dom_of = dict(zip(np.unique(trace.request_id).tolist(), trace.domain[first_row].tolist()))
        rdom = np.array([dom_of[r] for r in reqs.tolist()], np.int16)
        embedding = requests.embed_requests(reqs, rdom, vecs, seed=seed)

    step("per-batch expert load")
    tail = load.long_tail(trace.experts, N)
    return TraceAnalysis(info=info, layers=layers, lookback_expert=lb_expert,
                         lookback_device=lb_device, devices=devices, transition_layers=pairs,
                         transition_expert=t_exp, transition_device=t_dev, topk_mass=masses,
                         kurtosis_mid=kurt_mid, embedding=embedding, long_tail=tail,
                         sampled=sampled)
