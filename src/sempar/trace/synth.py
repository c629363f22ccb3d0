"""Synthetic routing traces with the statistics real MoE models show.

The generator is a small generative model of routing whose knobs are calibrated against the
papers (tests/trace/test_synth.py asserts the resulting figures):

- **Zipfian tokens per domain.** Each request belongs to one domain. A domain draws tokens from a
  Zipf-Mandelbrot law over its own ranking of the vocabulary: a few shared "common" tokens first
  (function words), then the domain's own tokens, then the other domains' tokens.
- **Semantic clusters (Sem-MoE A.2, bi-clustered conjugacy).** Every token belongs to a cluster
  (common tokens to common clusters, other tokens to clusters of their domain). A cluster owns a
  pool of `m` experts per layer; pools are drawn so that every expert sits in about the same number
  of pools (training's load-balancing loss leaves no dead expert). With group-limited routing
  (DeepSeek-V3) a pool lies inside `topk_groups` expert groups.
- **Static top-k per token (Sem-MoE §3.2, Table 1).** Token v's static top-k at layer l is k
  positions of its cluster's pool, chosen by a permutation id b(v, l) from a bank of random
  permutations of the pool. Each occurrence keeps slot j of the static set or, with probability
  d_j(v), swaps it for the token's alternate expert j (pool positions k..2k-1). d(v) has mean
  1 - q_v with q_v ~ Beta (the token's concentration), weighted towards the last slots (the
  router's weakest choices are the unstable ones), so a few alternates hold most of the rest.
- **Inter-layer Markov dependence (Sem-MoE A.2, ExFlow).** Pools are mapped from one layer to the
  next by a fixed expert permutation pi_l (group-preserving), and b(v, l+1) = b(v, l) with
  probability `layer_persistence`, else a fresh draw: a token that picked expert e at layer l
  tends to pick pi_l(e) at layer l+1, and a longer look-back identifies the token's path.
- **Domain shift of preferences (Sem-MoE A.1).** Besides the token mix, common tokens route their
  last `k // 4` slots (at least one) to domain-specific pool positions: context moves them.
- **Per-batch long tail (FSE-DP Fig. 2)** follows from the above: Zipfian clusters make a few
  experts hot in any small batch while many get no token.

Everything is a table lookup plus one random byte per (token, layer, slot), generated in fixed
blocks of `BLOCK` tokens from per-block seeds, so a seed gives the same trace whatever the
machine, and memory stays bounded however many tokens are asked for.
"""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from sempar.errors import InputError
from sempar.trace.io import TraceWriter
from sempar.trace.presets import PRESETS
from sempar.trace.schema import RoutingTrace, TraceMeta

BLOCK = 32768  # tokens per generated block (and Parquet row group)
DEFAULT_DOMAINS = ("code", "docs", "literature", "math", "chat", "multilingual")


@dataclass(frozen=True)
class SynthParams:
    """Knobs of the generator (defaults calibrated against Sem-MoE Table 1 and A.2)."""

    domains: tuple[str, ...] = DEFAULT_DOMAINS
    zipf_s: float = 1.05            # Zipf-Mandelbrot exponent of token ranks
    zipf_q: float = 2.7             # Zipf-Mandelbrot offset
    common_fraction: float = 0.004  # share of the vocabulary that is common to all domains
    clusters_per_domain: int = 3
    common_clusters: int = 1
    pool_factor: int = 4            # cluster pool size m = min(N, pool_factor * k)
    concentration_a: float = 18.0   # q_v ~ Beta(a, b): mean a / (a + b)
    concentration_b: float = 2.0
    slot_skew: float = 3.0          # d_j proportional to (j + 1) ** slot_skew
    layer_persistence: float = 0.5  # P[b(v, l+1) = b(v, l)]
    bank_size: int = 4096           # permutations of a pool to choose static sets from
    expert_skew: float = 4.0        # popularity of pool position i ~ (1 + i) ** -expert_skew
    request_sigma: float = 0.8      # log-normal spread of request lengths
    topic_spread: float = 4.0       # how much thinner off-topic tokens of the domain are spread


# Per-preset departures from the defaults. With top-2 of 8, one unstable slot is half the set:
# Mixtral needs a lower concentration for its p50 cumulative hotness to fall inside Sem-MoE's
# range rather than at 1.0 (the real Mixtral aggregates sit lower still, at about 0.70).
PRESET_PARAMS: dict[str, dict] = {"mixtral-8x7b": {"concentration_a": 6.0}}


@dataclass
class _Tables:
    """Per-vocabulary tables, built once per (shape, params, seed)."""

    static: np.ndarray      # int16[V, L, k]  static top-k
    alternate: np.ndarray   # int16[V, L, k]  the expert slot j deviates to
    static_dom: np.ndarray  # int16[D, Vc, L, k]  static top-k of common tokens, per domain
    deviate: np.ndarray     # uint8[V, k]  P(slot j deviates) * 256
    order: np.ndarray       # int32[D * P, V]  rank -> token id, per request topic
    cdf: np.ndarray         # float64[V]  Zipf-Mandelbrot CDF over ranks
    cluster: np.ndarray     # int32[V]
    n_common: int
    extra: dict = field(default_factory=dict)


def _pools(rng: np.random.Generator, shape: TraceMeta, C: int, m: int) -> np.ndarray:
    """int16[C, L, m]: each cluster's expert pool per layer, balanced over experts."""
    N, L, G = shape.num_experts, shape.num_layers, shape.num_expert_groups
    per_group = N // G
    usage = np.zeros(N)
    pool0 = np.empty((C, m), np.int64)
    group_usage = np.zeros(G)
    for c in range(C):
        if G > 1:  # the least used groups first, so that groups stay balanced too
            groups = np.argsort(group_usage + rng.random(G) * 0.5)[: shape.topk_groups]
            group_usage[groups] += 1
            allowed = (np.arange(N) // per_group)[:, None] == groups[None, :]
            allowed = allowed.any(axis=1)
        else:
            allowed = np.ones(N, bool)
        score = np.where(allowed, usage + rng.random(N) * 0.9, np.inf)
        pool0[c] = rng.permutation(np.argsort(score, kind="stable")[:m])
        usage[pool0[c]] += 1
    pools = np.empty((C, L, m), np.int16)
    pools[:, 0] = pool0
    for l in range(1, L):
        # pi_l permutes the groups and the experts inside each group.
        gperm = rng.permutation(G)
        inner = np.stack([rng.permutation(per_group) for _ in range(G)])
        e = pools[:, l - 1].astype(np.int64)
        g, r = e // per_group, e % per_group
        pools[:, l] = gperm[g] * per_group + inner[g, r]
    return pools


def _build_tables(shape: TraceMeta, p: SynthParams, seed: int) -> _Tables:
    rng = np.random.default_rng([seed, 0x5E3A])
    V, L, N, k = shape.vocab_size, shape.num_layers, shape.num_experts, shape.top_k
    D = len(p.domains)
    m = min(N, max(2 * k, p.pool_factor * k))
    if shape.num_expert_groups > 1:
        m = min(m, shape.topk_groups * (N // shape.num_expert_groups))
    C = p.common_clusters + D * p.clusters_per_domain
    n_common = max(16, int(round(p.common_fraction * V)))

    # Vocabulary: ids [0, n_common) are common; the rest are dealt to the domains.
    owner = np.full(V, -1, np.int64)
    owner[n_common:] = rng.permutation(V - n_common) % D
    cluster = np.empty(V, np.int32)
    cluster[:n_common] = rng.integers(0, p.common_clusters, n_common)
    cluster[n_common:] = (p.common_clusters + owner[n_common:] * p.clusters_per_domain
                          + rng.integers(0, p.clusters_per_domain, V - n_common))
    common_order = rng.permutation(n_common)
    P = p.clusters_per_domain
    order = np.empty((D * P, V), np.int32)
    for d in range(D):
        own = n_common + np.flatnonzero(owner[n_common:] == d)
        other = n_common + np.flatnonzero(owner[n_common:] != d)
        for t in range(P):
            # A request's topic is one of its domain's clusters: its tokens lead the ranking,
            # the domain's other tokens are spread `topic_spread` times thinner among them.
            on_topic = cluster[own] == p.common_clusters + d * P + t
            key = rng.random(own.size) * np.where(on_topic, 1.0, p.topic_spread)
            order[d * P + t] = np.concatenate([common_order, own[np.argsort(key)],
                                               rng.permutation(other)])
    ranks = np.arange(V, dtype=np.float64)
    cdf = np.cumsum((ranks + p.zipf_q) ** -p.zipf_s)
    cdf /= cdf[-1]

    pools = _pools(rng, shape, C, m)
    # Plackett-Luce permutations of the pool (Gumbel trick): early pool positions are popular,
    # which makes a batch of one domain pile onto a few experts (FSE-DP Fig. 2). The static k
    # are then shuffled among themselves, so the top-1 slot still tells tokens apart.
    popularity = -p.expert_skew * np.log1p(np.arange(m))
    bank = np.argsort(-(popularity + rng.gumbel(size=(p.bank_size, m))), axis=1)
    bank[:, :k] = np.take_along_axis(bank[:, :k], rng.random((p.bank_size, k)).argsort(axis=1), 1)
    bank = bank.astype(np.int16)
    # b(v, l): a Markov chain along the layers, per token.
    perm_id = np.empty((V, L), np.int32)
    perm_id[:, 0] = rng.integers(0, p.bank_size, V)
    for l in range(1, L):
        keep = rng.random(V) < p.layer_persistence
        perm_id[:, l] = np.where(keep, perm_id[:, l - 1], rng.integers(0, p.bank_size, V))

    static = np.empty((V, L, k), shape.expert_dtype)
    alternate = np.empty((V, L, k), shape.expert_dtype)
    layer_idx = np.arange(L)[None, :, None]
    for lo in range(0, V, 8192):  # chunks keep the int64 index temporaries small
        sl = slice(lo, lo + 8192)
        pos = bank[perm_id[sl]]                       # [v, L, m] pool positions
        cl = cluster[sl][:, None, None]
        static[sl] = pools[cl, layer_idx, pos[:, :, :k]]
        alternate[sl] = pools[cl, layer_idx, pos[:, :, k:2 * k]] if m >= 2 * k else static[sl]

    # Common tokens: the last ks slots move to domain-specific pool positions.
    ks = max(1, k // 4)
    free = m - 2 * k
    static_dom = np.repeat(static[None, :n_common], D, axis=0)
    if free >= ks:
        pos = bank[perm_id[:n_common]]                # [Vc, L, m]
        cl = cluster[:n_common][:, None, None]
        for d in range(D):
            for i in range(ks):
                col = 2 * k + (d * ks + i) % free
                static_dom[d, :, :, k - ks + i] = pools[cl[:, :, 0], np.arange(L)[None, :],
                                                        pos[:, :, col]]

    q = rng.beta(p.concentration_a, p.concentration_b, V)
    w = (np.arange(k) + 1.0) ** p.slot_skew
    w /= w.sum()
    dev = np.clip((1.0 - q)[:, None] * k * w[None, :], 0.0, 0.95)
    if m < 2 * k:
        dev[:] = 0.0
    deviate = np.round(dev * 256).astype(np.uint8)
    return _Tables(static, alternate, static_dom, deviate, order, cdf, cluster, n_common,
                   extra={"pool_size": m, "clusters": C, "common_tokens": n_common})


def _requests(rng: np.random.Generator, tokens: int, requests: int, D: int,
              sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(length int64[R] summing to `tokens`, domain int16[R]) of requests in arrival order."""
    raw = rng.lognormal(0.0, sigma, requests)
    length = np.maximum(1, np.floor(raw / raw.sum() * tokens)).astype(np.int64)
    diff = tokens - int(length.sum())
    while diff != 0:  # hand the rounding remainder out one token at a time
        idx = rng.choice(requests, size=min(abs(diff), requests), replace=False)
        if diff > 0:
            length[idx] += 1
            diff -= idx.size
        else:
            idx = idx[length[idx] > 1][: -diff]
            length[idx] -= 1
            diff += idx.size
    return length, rng.integers(0, D, requests).astype(np.int16)


class SynthGenerator:
    """Generate a synthetic trace block by block (fit-free: all state is built from the seed)."""

    def __init__(self, preset: str | TraceMeta, tokens: int, requests: int | None = None,
                 seed: int = 0, params: SynthParams | None = None, weights: bool = False):
        self.shape = PRESETS.get(preset) if isinstance(preset, str) else preset
        if tokens < 1:
            raise InputError(f"--tokens: {tokens} must be at least 1")
        requests = max(1, tokens // 256) if requests is None else requests
        if not 1 <= requests <= tokens:
            raise InputError(f"--requests: {requests} must be between 1 and the token count {tokens}")
        if tokens >= 2**31:
            raise InputError(f"--tokens: {tokens} is too many for int32 row ids")
        self.tokens, self.requests, self.seed = tokens, requests, seed
        self.params = params or SynthParams(**PRESET_PARAMS.get(self.shape.model, {}))
        self.weights = weights
        s = self.shape
        self.meta = replace(
            s, model=f"synthetic:{s.model}",
            extra={"generator": "sempar.synth", "preset": s.model, "seed": seed,
                   "params": {k: list(v) if isinstance(v, tuple) else v
                              for k, v in asdict(self.params).items()}})

    @property
    def domains(self) -> list[str]:
        return list(self.params.domains)

    def blocks(self) -> Iterator[dict[str, np.ndarray]]:
        """Yield dicts of arrays (token_id, request_id, position, domain, experts[, weights])."""
        tab = _build_tables(self.shape, self.params, self.seed)
        rng = np.random.default_rng([self.seed, 0x7E0])
        length, req_domain = _requests(rng, self.tokens, self.requests, len(self.params.domains),
                                       self.params.request_sigma)
        req_topic = rng.integers(0, self.params.clusters_per_domain, self.requests)
        request_of_row = np.repeat(np.arange(self.requests, dtype=np.int32), length)
        starts = np.cumsum(length) - length
        for b, lo in enumerate(range(0, self.tokens, BLOCK)):
            brng = np.random.default_rng([self.seed, 0xB10C, b])
            rows = np.arange(lo, min(lo + BLOCK, self.tokens))
            req = request_of_row[rows]
            dom = req_domain[req]
            rank = np.minimum(np.searchsorted(tab.cdf, brng.random(rows.size)), tab.cdf.size - 1)
            tok = tab.order[dom * self.params.clusters_per_domain + req_topic[req], rank]
            experts = tab.static[tok]
            common = np.flatnonzero(tok < tab.n_common)
            if common.size:
                experts[common] = tab.static_dom[dom[common], tok[common]]
            u = np.frombuffer(brng.bytes(experts.size), np.uint8).reshape(experts.shape)
            dev = u < tab.deviate[tok][:, None, :]
            np.copyto(experts, tab.alternate[tok], where=dev)
            out = {"token_id": tok.astype(np.int32), "request_id": req,
                   "position": (rows - starts[req]).astype(np.int32), "domain": dom,
                   "experts": experts}
            if self.weights:
                g = -np.sort(-brng.gamma(2.0, size=experts.shape).astype(np.float32), axis=2)
                out["weights"] = g / g.sum(axis=2, keepdims=True)
            yield out

    def to_trace(self) -> RoutingTrace:
        parts = list(self.blocks())
        cat = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
        return RoutingTrace(self.meta, cat["token_id"], cat["request_id"], cat["position"],
                            cat["experts"], domain=cat["domain"], domains=self.domains,
                            weights=cat.get("weights"))

    def write(self, path: str | os.PathLike,
              progress: Callable[[int], None] | None = None) -> None:
        """Stream the trace to a Parquet file (atomic). `progress(n)` is called per block."""
        with TraceWriter(path, self.meta, self.domains, has_weights=self.weights,
                         validate=False) as w:
            for blk in self.blocks():
                w.write(blk["token_id"], blk["request_id"], blk["position"], blk["experts"],
                        blk["domain"], blk.get("weights"))
                if progress:
                    progress(blk["token_id"].size)


def shard_paths(path: str | os.PathLike, shards: int) -> list[Path]:
    """`shards` file names beside `path`: trace.parquet -> trace.00.parquet, trace.01.parquet..."""
    p = Path(path)
    width = len(str(shards - 1))
    return [p.with_name(f"{p.stem}.{i:0{width}d}{p.suffix or '.parquet'}") for i in range(shards)]


def write_shards(gen: "SynthGenerator", paths: list[Path],
                 progress: Callable[[int], None] | None = None) -> None:
    """Stream `gen`'s trace into len(paths) files, cut at request boundaries (shard i holds
    requests [i R / K, (i + 1) R / K)), so their concatenation in order is the trace `write`
    would write (each file atomic; a request never straddles two)."""
    K = len(paths)
    writers = [TraceWriter(p, gen.meta, gen.domains, has_weights=gen.weights, validate=False)
               for p in paths]
    cur = 0
    writers[0].__enter__()
    try:
        for blk in gen.blocks():
            shard = (blk["request_id"].astype(np.int64) * K) // gen.requests
            for i in np.unique(shard):
                while cur < i:
                    writers[cur].__exit__(None, None, None)
                    cur += 1
                    writers[cur].__enter__()
                m = shard == i
                writers[cur].write(blk["token_id"][m], blk["request_id"][m], blk["position"][m],
                                   blk["experts"][m], blk["domain"][m],
                                   None if blk.get("weights") is None else blk["weights"][m])
            if progress:
                progress(blk["token_id"].size)
        while cur < K - 1:                    # shards left without requests stay valid files
            writers[cur].__exit__(None, None, None)
            cur += 1
            writers[cur].__enter__()
    except BaseException as err:
        writers[cur].__exit__(type(err), err, err.__traceback__)
        raise
    writers[cur].__exit__(None, None, None)


def synthesize(preset: str, tokens: int, requests: int | None = None, seed: int = 0,
               **kwargs) -> RoutingTrace:
    """In-memory synthetic trace (see `SynthGenerator`)."""
    return SynthGenerator(preset, tokens, requests, seed, **kwargs).to_trace()
