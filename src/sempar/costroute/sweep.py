"""The lambda sweep of CAMoE §4.4-4.5 on a real (tiny) model: latency, routing shift, quality.

Protocol (ours where CAMoE is silent):
- Text: see `sempar.costroute.text` (held-out documents of every domain, interleaved).
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

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sempar.errors import InputError
from sempar.costroute.cost_bias import TokenBytes, build_tables, destination_table
from sempar.costroute.hook import CostRoutingHook
from sempar.costroute.metrics import finish
from sempar.costroute.passes import per_batch_counts, point_figures, run_pass
from sempar.costroute.text import Sequences, load_sequences

DEFAULT_LAMBDAS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25)


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


def validate_config(cfg: SweepConfig) -> tuple[list[float], list[Any]]:
    """Check the options before any slow work: (sorted lambdas with 0, topologies)."""
    from sempar.comm.topology_presets import load_topology
    from sempar.models import resolve_model

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
    from sempar.models import load_model, resolve_model
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
    nbytes = TokenBytes.for_option(hidden, k, E, cfg.token_bytes)
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
