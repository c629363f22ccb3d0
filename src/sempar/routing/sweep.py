"""The lambda sweep of CAMoE §4.4-4.5 on a real (tiny) model: latency, routing shift, quality.

Protocol (ours where CAMoE is silent):
- Text: held-out documents of every corpus domain (`sempar.tiny.data.split_corpus`: never
  trained on), tokenised, joined by end-of-text, cut into `seq_len` sequences, at most
  `tokens_per_domain` tokens per domain; sequences are interleaved across domains so every
  batch mixes them. One batch (`batch_size` sequences) = one forward = one all-to-all sample
  (a last, partial batch counts for quality but not for the all-to-all figures).
- Homes (S): Attention-DP, sequence b of a batch on device b mod G (round-robin DP ranks).
- Placement: `vanilla` (device g hosts experts [gE/G, (g+1)E/G)), `round-robin`, or a placement
  JSON; node ids from the topology.
- One-shot accounting (§3.4): the lambda = 0 pass gives the per-forward dispatch counts (mean
  over its batches) from which the tables are built; every lambda then reruns the same text with
  the hook.
- All-to-all: CAMoE eq. 9 per (forward, layer) (`cost_bias.a2a_layer_seconds`); we report the
  mean and p95 over all (forward, layer) samples and per layer (mean and p95 over forwards).
  CAMoE Table 1 reports "mean forward All-to-All latency per MoE layer" and its p95.
- Routing shift (CAMoE Table 2; definitions inferred from its magnitudes): `cv` = std/mean of
  the expert activation counts summed over layers (E values); `avg_layer_cv` = mean over layers
  of the cv of that layer's counts; `kl` = KL(p_lambda || p_0) of the layer-summed expert
  distribution (nats); `avg_layer_kl` = mean over layers of the per-layer KL.
- Quality: perplexity and next-token accuracy (argmax) per domain; `acc_mean` / `ppl_mean` are
  unweighted means over domains (CAMoE averages its nine tasks unweighted).
- Pareto point: the lambda with the largest cut of the mean all-to-all whose mean accuracy loss
  is at most `max_acc_loss` points (default 1.2, CAMoE's loss at lambda = 0.25); `front` lists
  the lambdas no other lambda beats on both mean all-to-all and mean accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from sempar.errors import InputError
from sempar.routing.cost_bias import (TokenBytes, a2a_layer_seconds, build_tables,
                                      destination_table, dispatch_counts, link_cost_share)
from sempar.routing.hook import CostRoutingHook
from sempar.routing.metrics import device_imbalance, finish, routing_shift

DEFAULT_LAMBDAS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25)


# --------------------------------------------------------------------------- text

@dataclass
class Sequences:
    """tokens[i]: int64[<= seq_len]; domain[i]: index into domains; interleaved order."""

    tokens: list[np.ndarray] = field(default_factory=list)
    domain: list[int] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)

    def tokens_per_domain(self) -> dict[str, int]:
        out = {d: 0 for d in self.domains}
        for t, d in zip(self.tokens, self.domain):
            out[self.domains[d]] += int(t.size)
        return out


def chunk_streams(streams: dict[str, list[list[int]]], eos: int, seq_len: int,
                  tokens_per_domain: int) -> Sequences:
    """Join each domain's documents (token lists) with `eos`, cut into `seq_len` pieces up to
    `tokens_per_domain` tokens, and interleave the domains' pieces round-robin."""
    if seq_len < 2 or tokens_per_domain < 2:
        raise InputError(f"--seq-len {seq_len} and --tokens-per-domain {tokens_per_domain} "
                         "must be at least 2")
    per: dict[str, list[np.ndarray]] = {}
    for domain, docs in streams.items():
        ids: list[int] = []
        for d in docs:
            if len(ids) >= tokens_per_domain:
                break
            ids.extend(d)
            ids.append(eos)
        ids = ids[:tokens_per_domain]
        pieces = [np.asarray(ids[i:i + seq_len], np.int64) for i in range(0, len(ids), seq_len)]
        pieces = [p for p in pieces if p.size >= 2]
        if pieces:
            per[domain] = pieces
    if not per:
        raise InputError("no held-out text: every domain is empty")
    out = Sequences(domains=sorted(per))
    for i in range(max(len(v) for v in per.values())):
        for j, d in enumerate(out.domains):
            if i < len(per[d]):
                out.tokens.append(per[d][i])
                out.domain.append(j)
    return out


def heldout_sequences(corpus: Path, tokenizer_path: Path, tokens_per_domain: int,
                      seq_len: int) -> Sequences:
    """Held-out text of every domain of a `sempar corpus fetch` folder (see module docstring)."""
    from tokenizers import Tokenizer

    from sempar.tiny.data import split_corpus
    from sempar.tiny.tokenizer import EOS

    tok = Tokenizer.from_file(str(tokenizer_path))
    splits = split_corpus(Path(corpus), tok, heldout_tokens=tokens_per_domain)
    streams = {s.domain: [e.ids for e in tok.encode_batch(s.heldout, add_special_tokens=False)]
               for s in splits}
    return chunk_streams(streams, tok.token_to_id(EOS) or 0, seq_len, tokens_per_domain)


def text_sequences(pairs: Sequence[tuple[str, str]], tokenizer_path: Path, tokens_per_domain: int,
                   seq_len: int) -> Sequences:
    """(text, domain) pairs -> sequences (each text one document of its domain)."""
    from tokenizers import Tokenizer

    from sempar.tiny.tokenizer import EOS

    tok = Tokenizer.from_file(str(tokenizer_path))
    streams: dict[str, list[list[int]]] = {}
    for text, domain in pairs:
        streams.setdefault(domain, []).append(tok.encode(text, add_special_tokens=False).ids)
    return chunk_streams(streams, tok.token_to_id(EOS) or 0, seq_len, tokens_per_domain)


# --------------------------------------------------------------------------- one pass

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


# --------------------------------------------------------------------------- the sweep

@dataclass
class SweepConfig:
    """What `sempar cost-route sweep` runs. batch_size None = 2 * ep sequences per forward;
    token_bytes None = the model's hidden size in bf16."""

    model: str = "tiny-moe64"
    topologies: tuple[str, ...] = ("hetero-cloud",)
    ep: int = 8
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    tokens_per_domain: int = 4096
    seq_len: int = 256
    batch_size: int | None = None
    placement: str = "vanilla"
    dedup: bool = False
    mode: str = "logits"
    token_bytes: int | None = None
    max_acc_loss: float = 1.2
    corpus: Path | None = None
    texts: tuple[str, ...] = ()

    def checked_lambdas(self) -> list[float]:
        lams = sorted({float(x) for x in self.lambdas} | {0.0})
        bad = [x for x in lams if not np.isfinite(x) or x < 0]
        if bad:
            raise InputError(f"--lambdas: {bad[0]} is not a non-negative number")
        return lams


def make_hosts(placement: str, num_layers: int, num_experts: int, topology: Any) -> tuple[np.ndarray, str]:
    """bool[L, G, E] of `vanilla`, `round-robin` or a placement JSON file, and its name."""
    from sempar.placement.placement import Placement

    G = topology.num_devices
    if placement in ("vanilla", "round-robin"):
        if num_experts % G:
            raise InputError(f"--ep {G}: {num_experts} experts do not split evenly over {G} devices")
        order = (np.arange(num_experts) if placement == "vanilla"
                 else np.concatenate([np.arange(g, num_experts, G) for g in range(G)]))
        p = Placement(np.tile(order, (num_layers, 1)), num_experts, G, topology.node_of, placement)
        return p.validate().hosts(), placement
    p = Placement.load(placement)
    if (p.num_layers, p.num_experts, p.num_devices) != (num_layers, num_experts, G):
        raise InputError(f"--placement {placement}: {p.num_layers} layers x {p.num_experts} "
                         f"experts on {p.num_devices} devices; the model and topology need "
                         f"{num_layers} x {num_experts} on {G}")
    return p.hosts(), p.method or Path(placement).stem


def load_sequences(cfg: SweepConfig, tokenizer_path: Path) -> Sequences:
    """The text of the sweep: `--text FILE[:DOMAIN]` files, else the corpus's held-out documents."""
    import os

    if cfg.texts:
        from sempar.trace.record import read_texts

        return text_sequences(read_texts(list(cfg.texts)), tokenizer_path, cfg.tokens_per_domain,
                              cfg.seq_len)
    corpus = cfg.corpus or os.environ.get("SEMPAR_CORPUS")
    if not corpus:
        raise InputError("give --corpus DIR (`sempar corpus fetch --out DIR` builds it), "
                         "$SEMPAR_CORPUS, or --text FILE[:DOMAIN]")
    return heldout_sequences(Path(corpus), tokenizer_path, cfg.tokens_per_domain, cfg.seq_len)


def validate_config(cfg: SweepConfig) -> tuple[list[float], list[Any]]:
    """Check the options before any slow work: (sorted lambdas with 0, topologies)."""
    from sempar.comm.topology import load_topology
    from sempar.trace.record import resolve_model

    lams = cfg.checked_lambdas()
    if cfg.ep < 1:
        raise InputError(f"--ep: {cfg.ep} is not a positive integer")
    if cfg.max_acc_loss < 0:
        raise InputError(f"--max-acc-loss: {cfg.max_acc_loss} is negative")
    if cfg.batch_size is not None and cfg.batch_size < 1:
        raise InputError(f"--batch-size: {cfg.batch_size} is not a positive integer")
    if cfg.token_bytes is not None and cfg.token_bytes < 1:
        raise InputError(f"--token-bytes: {cfg.token_bytes} is not positive")
    topos = [load_topology(t) for t in cfg.topologies]
    if not topos:
        raise InputError("--topology: give at least one")
    for t in topos:
        if t.num_devices != cfg.ep:
            raise InputError(f"--topology {t.name} has {t.num_devices} devices, --ep is {cfg.ep}")
    resolve_model(cfg.model)
    return lams, topos


def run_sweeps(cfg: SweepConfig, progress: Callable[[str], Any] | None = None,
               model: Any = None, seqs: Sequences | None = None) -> list[dict[str, Any]]:
    """The lambda sweep on every topology of `cfg`; the lambda = 0 pass is shared. Returns one
    result dict per topology: {"model", "topology", "ep", "placement", "mode", "dedup",
    "homes", "tokens", "domains", "batch_size", "seq_len", "forwards", "bytes",
    "table_fp16_bytes", "points": [per lambda], "pareto"}. `model`/`seqs` skip the loading."""
    from sempar.trace.record import load_model, resolve_model
    from sempar.trace.routers import trace_meta_for

    say = progress or (lambda _m: None)
    lams, topos = validate_config(cfg)
    batch_size = cfg.batch_size or 2 * cfg.ep
    src = resolve_model(cfg.model)
    if seqs is None:
        say("text")
        seqs = load_sequences(cfg, src.tokenizer_path)
    if model is None:
        say("model")
        model = load_model(src.model_dir)
    probe = CostRoutingHook(model, None, cfg.mode)
    meta = trace_meta_for(model, probe.sites, src.name)
    L, E, k = meta.num_layers, meta.num_experts, meta.top_k
    hidden = int(model.config.hidden_size)
    nbytes = (TokenBytes.for_model(hidden, k, E) if cfg.token_bytes is None else
              TokenBytes(float(cfg.token_bytes + 4 * k), float(cfg.token_bytes), float(4 * E)))
    hosts_of = {t.name: make_hosts(cfg.placement, L, E, t) for t in topos}
    say("lambda 0")
    base = run_pass(model, seqs, CostRoutingHook(model, None, cfg.mode), cfg.ep, batch_size)
    results = []
    for topo in topos:
        hosts, pname = hosts_of[topo.name]
        dest = destination_table(hosts, topo, nbytes.dispatch)
        tables = build_tables(topo, hosts, per_batch_counts(base, dest, batch_size, cfg.dedup).mean(0),
                              nbytes, dest)
        points = []
        for lam in lams:
            if lam == 0:
                res = base
            else:
                say(f"{topo.name} lambda {lam:g}")
                res = run_pass(model, seqs, CostRoutingHook(model, tables.at(lam), cfg.mode),
                               cfg.ep, batch_size)
            points.append(point_figures(lam, res, base, topo, hosts, dest, nbytes, batch_size,
                                        cfg.dedup, seqs.domains))
        par = finish(points, cfg.max_acc_loss)
        results.append({"model": src.name, "topology": topo.name, "ep": cfg.ep,
                        "placement": pname, "mode": cfg.mode, "dedup": cfg.dedup,
                        "homes": "attention-dp: sequence b of a batch on device b mod G",
                        "tokens": int(sum(t.size for t in seqs.tokens)),
                        "domains": seqs.tokens_per_domain(), "batch_size": batch_size,
                        "seq_len": cfg.seq_len, "forwards": base.full_batches,
                        "bytes": nbytes.to_json(), "table_fp16_bytes": tables.nbytes_fp16(),
                        "points": points, "pareto": par})
    return results
