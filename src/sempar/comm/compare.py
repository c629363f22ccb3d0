"""Runs of the simulator from a trace file: one (placement, pipeline, topology) or a grid of
methods x pipelines x topologies (`sempar simulate --compare`), with a table and a PNG.

Protocol (docs/design.md): the trace is split by request, 20% to fit (placement solvers, online
schedulers), 80% simulated. `--placement` is a placement JSON or a method name solved on the fit
split for the topology's devices and nodes (a JSON's device count must match the topology).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sempar.comm.homes import Homes
from sempar.comm.pipelines import PIPELINES
from sempar.comm.simulate import SimOptions, simulate, summary
from sempar.comm.topology import Topology
from sempar.comm.topology_presets import load_topology
from sempar.errors import InputError
from sempar.placement.placement import Placement
from sempar.trace.schema import RoutingTrace


@dataclass
class Study:
    """A trace split once, placements and homes cached across pipelines and topologies."""

    fit: RoutingTrace
    eval: RoutingTrace
    opts: SimOptions
    schedule: str = "auto"
    policy: str = "alg2"
    seed: int = 0
    _placements: dict = field(default_factory=dict)
    _homes: dict = field(default_factory=dict)

    @classmethod
    def from_trace(cls, trace: RoutingTrace, opts: SimOptions, fit_fraction: float = 0.2,
                   **kw) -> "Study":
        from sempar.trace.ops import split_by_request

        fit, eval_ = split_by_request(trace, fit_fraction, seed=kw.get("seed", 0))
        return cls(fit, eval_, opts, **kw)

    def placement(self, spec: str, topo: Topology) -> Placement:
        key = (spec, topo.num_devices, topo.num_nodes)
        if key not in self._placements:
            p = Path(spec)
            if p.suffix == ".json" or p.is_file():
                pl = Placement.load(p)
            else:
                from sempar.placement.base import solve

                pl = solve(spec, self.fit, num_devices=topo.num_devices,
                           num_nodes=topo.num_nodes, seed=self.seed)
            if pl.num_devices != topo.num_devices:
                raise InputError(f"placement {spec}: {pl.num_devices} devices, topology "
                                 f"{topo.name}: {topo.num_devices}")
            if pl.num_experts != self.eval.meta.num_experts:
                raise InputError(f"placement {spec}: {pl.num_experts} experts, the trace "
                                 f"{self.eval.meta.num_experts}")
            self._placements[key] = pl
        return self._placements[key]

    def run(self, spec: str, pipeline: str, topo: Topology) -> dict:
        pipe = PIPELINES.get(pipeline)
        if pipe.chained:            # ExFlow moves a token to its top-1 (slot 0) expert's device
            from sempar.trace.schema import require_sorted_slots

            require_sorted_slots(self.eval.meta, f"pipeline {pipeline}")
        pl = self.placement(spec, topo)
        key = (spec, topo.num_devices, topo.num_nodes)
        if key not in self._homes:
            self._homes[key] = Homes(pl, self.eval, self.fit, self.schedule, self.policy,
                                     self.opts.batch)
        homes = self._homes[key]
        res = simulate(self.eval.experts, homes(pipe), pl, topo, pipe, self.opts)
        res["placement"] = pl.method or spec
        res["scheduled"] = homes.scheduled(pipe) if pipe.expert_parallel else None
        return res


def run_grid(study: Study, methods: list[str], pipelines: list[str], topologies: list[str],
             nodes: int | None = None, progress=None) -> list[dict]:
    """One row per (method, pipeline, topology): summary figures and the ratios to the first
    method (the baseline, e.g. vanilla) on the same pipeline and topology."""
    rows = []
    for tname in topologies:
        topo = load_topology(tname, nodes)
        for pname in pipelines:
            base = None
            for m in methods:
                if progress:
                    progress(f"{m} / {pname} / {topo.name}")
                r = study.run(m, pname, topo)
                t = r["total"]
                row = {"method": m, "pipeline": PIPELINES.get(pname).name, "topology": topo.name,
                       "scheduled": r["scheduled"], "bytes_per_token": t["bytes_per_token"],
                       "a2a_seconds_mean": t["a2a_seconds_mean"],
                       "a2a_seconds_p95": t["a2a_seconds_p95"],
                       "comm_seconds_mean": t["comm_seconds_mean"], "lar_mean": t["lar_mean"],
                       "remote_copies_per_token": t["remote_copies_per_token"]}
                if base is None:
                    base = row
                row["a2a_speedup"] = _ratio(base["a2a_seconds_mean"], row["a2a_seconds_mean"])
                row["comm_speedup"] = _ratio(base["comm_seconds_mean"], row["comm_seconds_mean"])
                row["bytes_ratio"] = _ratio(row["bytes_per_token"], base["bytes_per_token"])
                rows.append(row)
    return rows


def _ratio(a: float, b: float) -> float | None:
    return float(a / b) if b > 0 else None


def plot_grid(rows: list[dict], path: str | Path, title: str = "") -> None:
    """Bars: mean all-to-all (eq. 9) and total communication time per batch, one group per
    (pipeline, topology), one bar per method; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sempar.atomic import atomic_path

    groups = list(dict.fromkeys((r["pipeline"], r["topology"]) for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 1.1 * len(groups) * max(1, len(methods)) / 2 + 3), 7),
                             sharex=True)
    width = 0.8 / max(1, len(methods))
    x = np.arange(len(groups))
    for ax, key, label in ((axes[0], "a2a_seconds_mean", "all-to-all ms / batch (eq. 9)"),
                           (axes[1], "comm_seconds_mean", "all communication ms / batch")):
        for i, m in enumerate(methods):
            vals = [next((r[key] * 1e3 for r in rows if r["method"] == m
                          and (r["pipeline"], r["topology"]) == g), np.nan) for g in groups]
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, vals, width, label=m)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[0].set_title(title or "sempar simulate --compare")
    axes[1].set_xticks(x, [f"{p}\n{t}" for p, t in groups], fontsize=8)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def single(study: Study, spec: str, pipeline: str, topo: Topology) -> dict:
    """One run's JSON-ready summary (`simulate --json`)."""
    return summary(study.run(spec, pipeline, topo))


def with_options(opts: SimOptions, **kw) -> SimOptions:
    return replace(opts, **{k: v for k, v in kw.items() if v is not None})
