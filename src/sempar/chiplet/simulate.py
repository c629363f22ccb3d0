"""The simulator's front door: a workload x hardware x strategies -> latency, utilization, memory.

For every strategy, every (iteration, model layer) MoE-layer instance is simulated by its engine
(ep.py, naive.py, flow.py); token buffering first rewrites the instances (buffering.py). Figures:

- `layer_latency_s`: mean MoE-layer latency over the instances (Fig. 9's per-layer latency);
- `layer_latency_by_layer_s`: float[L] the same per model layer;
- `e2e_latency_s`: sum over all instances of attention + MoE layer (100 iterations, Fig. 14);
- `utilization`: compute-array busy time / (dies x MoE time), over all instances (Figs. 11, 15, 18);
- `peak_onchip_bytes`: largest on-chip footprint (expert weights + token activations, summed over
  dies) over the instances measured (Fig. 12); flow engines measure a sample of 64 instances;
- `timeline`: utilization over time of one snapshot instance (Fig. 11) and `activity`, its per-die
  DDR / D2D / compute intervals (Fig. 13).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from sempar.chiplet.attention import attention_seconds
from sempar.chiplet.buffering import buffered_instances
from sempar.chiplet.ep import contiguous_placement, simulate_ep
from sempar.chiplet.flow import auto_micro_slices, simulate_flow
from sempar.chiplet.hardware import ChipletConfig
from sempar.chiplet.hydra import hydra_homes, hydra_placement
from sempar.chiplet.models import precision_bytes
from sempar.chiplet.naive import simulate_naive
from sempar.chiplet.strategies import Strategy
from sempar.chiplet.workload import Instances, Workload, plain_instances


@dataclass
class StrategyResult:
    name: str
    moe_s: np.ndarray             # float64[B] MoE-layer latency per instance
    attn_s: np.ndarray            # float64[B]
    busy_s: np.ndarray            # float64[B] compute busy, summed over dies
    peak_bytes: float
    layer: np.ndarray             # int64[B]
    dies: int
    activity: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def layer_latency_s(self) -> float:
        return float(self.moe_s.mean())

    @property
    def e2e_latency_s(self) -> float:
        return float(self.moe_s.sum() + self.attn_s.sum())

    @property
    def utilization(self) -> float:
        return float(self.busy_s.sum() / (self.dies * self.moe_s.sum())) if self.moe_s.sum() > 0 else 0.0

    def by_layer(self) -> list[float]:
        L = int(self.layer.max()) + 1
        s = np.bincount(self.layer, weights=self.moe_s, minlength=L)
        c = np.bincount(self.layer, minlength=L)
        return (s / np.maximum(c, 1)).tolist()

    def timeline(self, bins: int = 50) -> dict:
        """Fraction of dies computing in each of `bins` equal time bins of the snapshot instance."""
        comp = [(a[1], a[2], a[3]) for a in self.activity if a[0] == "compute"]
        if not comp:
            return {"t_s": [], "utilization": []}
        end = max(c[2] for c in comp)
        edges = np.linspace(0.0, end, bins + 1)
        u = np.zeros(bins)
        for _, s, e in comp:
            u += np.clip(np.minimum(edges[1:], e) - np.maximum(edges[:-1], s), 0, None)
        u /= (edges[1] - edges[0]) * self.dies
        return {"t_s": ((edges[:-1] + edges[1:]) / 2).tolist(), "utilization": u.tolist()}

    def to_json(self) -> dict:
        return {"layer_latency_s": self.layer_latency_s, "e2e_latency_s": self.e2e_latency_s,
                "utilization": self.utilization, "peak_onchip_bytes": self.peak_bytes,
                "layer_latency_by_layer_s": self.by_layer(),
                "moe_seconds": float(self.moe_s.sum()), "attention_seconds": float(self.attn_s.sum()),
                "utilization_timeline": self.timeline(), **self.extra}


def snapshot_index(inst: Instances) -> int:
    """The instance drawn in Figs. 11 and 13: the middle layer of the middle iteration."""
    it = int(inst.iteration.max()) // 2
    lay = int(inst.layer.max()) // 2
    hit = np.flatnonzero((inst.iteration == it) & (inst.layer == lay))
    return int(hit[0]) if hit.size else 0


def simulate(wl: Workload, cfg: ChipletConfig, strategies: list[Strategy], precision: str = "int8",
             micro_slices: int | None = None, progress: Callable[[str], None] | None = None) -> dict[str, StrategyResult]:
    """Run every strategy on the workload; results by strategy name. `micro_slices` None: auto
    (flow.auto_micro_slices)."""
    model = wl.model
    wb = precision_bytes(precision)
    D = cfg.dies
    if micro_slices is None:
        micro_slices = auto_micro_slices(cfg, model.expert_params * wb)
    plain = plain_instances(wl)
    cache: dict = {}

    def counts_of(inst: Instances, key) -> np.ndarray:
        if key not in cache:
            cache[key] = inst.counts(D)
        return cache[key]

    attn_plain = attention_seconds(plain, model, cfg, wb)
    out: dict[str, StrategyResult] = {}
    for s in strategies:
        if progress:
            progress(s.name)
        inst, extra, key, held = plain, {}, "plain", 0
        attn = attn_plain
        if s.slack is not None:
            inst, log = buffered_instances(wl, s.slack)
            key = ("buf", s.slack)
            attn = attention_seconds(inst, model, cfg, wb)
            extra = {"deferrals": int(sum(log.deferrals.values())), "qos_respected": log.deadline_ok}
            held = log.held_max * model.d_model * cfg.act_bytes        # deferred activations on chip
        snap = snapshot_index(inst)
        sizes = inst.sizes()
        tok_bytes = 2 * sizes * model.d_model * cfg.act_bytes      # inputs + outputs, one copy
        if s.kind in ("ep", "hydra"):
            if s.kind == "ep":
                die_of = contiguous_placement(inst.num_experts, D, model.layers)
                home = inst.home(D)
            else:
                if ("hydra", key) not in cache:          # shared by hydra and hydra-db
                    die_of = hydra_placement(inst, model.layers, D)
                    cache["hydra", key] = die_of, hydra_homes(inst, die_of, D)
                die_of, home = cache["hydra", key]
            r = simulate_ep(inst, die_of, home, cfg, model.d_model, model.expert_params, wb, snap,
                            buffers=2 if s.double_buffer else 1)
            res = StrategyResult(s.name, r.latency, attn, r.busy.sum(axis=1), float(r.peak_bytes.max()),
                                 inst.layer, D, r.activity, {"d2d_bytes_per_layer": float(r.d2d_bytes.mean())})
        elif s.kind == "naive":
            r = simulate_naive(counts_of(inst, key), sizes, cfg, model.d_model, model.expert_params, wb, snap)
            res = StrategyResult(s.name, r.latency, attn, r.busy.sum(axis=1), float(r.peak_bytes.max()),
                                 inst.layer, D, r.activity, {"d2d_bytes_per_layer": float(r.d2d_bytes.mean())})
        else:
            r = simulate_flow(counts_of(inst, key), cfg, model.expert_params, wb, micro_slices,
                              paired=s.paired, rule5=s.rule5, snapshot=snap)
            peak = (r.peak_slots.sum(axis=1) * r.slot_bytes + tok_bytes[r.peak_of]).max() + held
            res = StrategyResult(s.name, r.latency, attn, r.busy.sum(axis=1), float(peak), inst.layer, D,
                                 r.activity, {"d2d_bytes_per_layer": float(r.d2d_bytes.mean())})
        res.extra.update(extra)
        out[s.name] = res
    return out
