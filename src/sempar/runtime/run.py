"""Run one forward of a batch expert-parallel over G processes; logits, bytes and timings.

    from sempar.runtime import RunSpec, run
    res = run(RunSpec(model="tiny-moe64", input_ids=ids, placement=p, mode="attn-dp"), world=4)
    res.logits          # float32[B, S, V] (rank 0's)
    res.bytes           # {(layer, collective): int64[G, G] bytes src -> dst}; layer -1: output
    res.dispatch_combine()   # int64[L, 2, G, G], comparable with simulate()'s bytes_per_pair

Against `sempar.comm.simulate` (SimOptions(hidden=H, dtype_bytes=4, batch=T, dedup=True,
one_shot=True), a uniform topology, the same homes), tested equal per layer and pair:

- dispatch and combine of attn-dp (= `sglang-ep`), tp-allreduce (= `ds-moe` with dedup and
  one-shot metadata), tp-rebatch (= `smoe`, homes from the same re-batching plans): exact;
- exflow: combine exact; dispatch = the simulator's + 4 bytes per copy (the global token index
  the top-1 device needs to place the token in the next layer's context);
- not in the simulator: `sizes` (8 bytes per pair per all2allv with unknown receive sizes),
  `output` (final hidden states to rank 0), exflow's per-layer `context-ag` (the simulator
  charges one all-gather of the new tokens per decode iteration); the attention collectives are
  direct all-to-all RS / AG (per-rank totals equal the ring's with equal chunks; per pair they
  spread over all peers where the simulator puts them on the ring successor).

Per-process entries: `rank_main(rank, world, port, specs)`, which `launch` spawns locally, and
`testbed_rank(rank, world, specs_path, out_path)`, which `testbed.launch` runs in the network
namespaces of the testbed or over loopback (`sempar bench`). `res.seconds("moe_block")` and
`res.rank_seconds` give the per-layer times of `modes.CLOCKS` (max over ranks / per rank).
"""

from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sempar.runtime.dist import init, launch


@dataclass
class RunSpec:
    """model: packaged name or folder; input_ids: int64[B, S]; placement: Placement (G devices);
    request_rank: int64[B] DP rank per request (default b % G); targets: int64[L, B*S] the
    preferred device per token and layer for tp-rebatch (default none: vanilla chunks);
    priority: float[L, B*S] their confidences (a full device keeps its most confident tokens);
    repeats: forwards to time (logits and bytes from the first); fault: test hook
    {"rank", "layer", "kind": "exit" | "hang"}."""

    model: str
    input_ids: torch.Tensor
    placement: Any
    mode: str = "attn-dp"
    request_rank: torch.Tensor | None = None
    targets: torch.Tensor | None = None
    priority: torch.Tensor | None = None
    rebatch: str = "align"
    timeout: float = 30.0
    addr: str | None = None
    repeats: int = 1
    fault: dict | None = None


@dataclass
class RunResult:
    logits: torch.Tensor | None
    bytes: dict[tuple[int, str], np.ndarray]
    layer_seconds: np.ndarray            # float64[L]: per MoE layer, max over ranks, min over repeats
    forward_seconds: float               # max over ranks, min over repeats
    world: int
    mode: str
    info: dict = field(default_factory=dict)
    # {bucket: float64[G, L]} per rank (min over repeats), buckets modes.CLOCKS: layer,
    # moe_block (router, dispatch, experts, combine), attn_comm (attention-side collectives)
    rank_seconds: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_rank0(cls, r: dict, world: int, mode: str) -> "RunResult":
        """From rank 0's dict of `_run_one`."""
        return cls(r["logits"], r["bytes"], r["rank_seconds"]["layer"].max(axis=0),
                   r["forward_seconds"], world, mode, rank_seconds=r["rank_seconds"])

    def seconds(self, bucket: str) -> np.ndarray:
        """float64[L]: the bucket's seconds per layer, max over ranks."""
        return self.rank_seconds[bucket].max(axis=0)

    def total(self, name: str | None = None) -> int:
        return int(sum(v.sum() for (l, n), v in self.bytes.items() if name in (None, n)))

    def per_layer(self, names: tuple[str, ...], num_layers: int) -> np.ndarray:
        """int64[L, len(names), G, G] bytes per layer, collective, src, dst."""
        G = self.world
        out = np.zeros((num_layers, len(names), G, G), np.int64)
        for (l, n), v in self.bytes.items():
            if n in names and l >= 0:
                out[l, names.index(n)] += v
        return out

    def dispatch_combine(self, num_layers: int) -> np.ndarray:
        return self.per_layer(("dispatch", "combine"), num_layers)


def _inject(comm, fault: dict | None) -> None:
    if not fault or fault.get("rank") != comm.rank:
        return
    inner = comm._a2a

    def a2a(out, inp, os_, is_, layer, name):
        if layer == fault.get("layer", 0):
            if fault.get("kind", "exit") == "exit":
                os._exit(3)
            time.sleep(10_000)
        return inner(out, inp, os_, is_, layer, name)

    comm._a2a = a2a


def rank_main(rank: int, world: int, port: int | None, specs: list[RunSpec]) -> list | None:
    """One rank: join the group, then run every spec in turn (`run_specs`)."""
    device = init(rank, world, port, specs[0].addr, max(s.timeout for s in specs))
    return run_specs(rank, world, device, specs)


def testbed_rank(rank: int, world: int, specs_path: str, out_path: str) -> dict | None:
    """One testbed / loopback rank of `testbed.launch` (process group already up, gloo, CPU):
    run every RunSpec of the pickle at `specs_path` after one untimed warm-up forward (allocator,
    lazy imports); rank 0 pickles its list of result dicts to `out_path`."""
    specs = pickle.loads(Path(specs_path).read_bytes())
    out = run_specs(rank, world, torch.device("cpu"), specs, warmup=True)
    if rank != 0:
        return None
    tmp = Path(out_path + ".tmp")
    tmp.write_bytes(pickle.dumps(out))
    os.replace(tmp, out_path)
    return {"specs": len(specs)}


def run_specs(rank: int, world: int, device: torch.device, specs: list[RunSpec],
              warmup: bool = False) -> list | None:
    """Per spec load the model's weights (once per model) and this rank's experts and run the
    forward(s); rank 0 returns one dict per spec {"logits", "bytes", "rank_seconds",
    "forward_seconds"}, the others None. warmup: one untimed forward of the first spec first."""
    import copy
    import dataclasses

    from transformers.utils import logging as hf_logging

    from sempar.models import load_model

    hf_logging.disable_progress_bar()
    models: dict[str, Any] = {}
    out = []
    for i, spec in enumerate(specs):
        if spec.model not in models:
            models[spec.model] = load_model(spec.model).to(device)
        if warmup and i == 0:
            _run_one(rank, world, device, copy.deepcopy(models[spec.model]),
                     dataclasses.replace(spec, repeats=1))
        out.append(_run_one(rank, world, device, copy.deepcopy(models[spec.model]), spec))
    return out if rank == 0 else None


def _run_one(rank: int, world: int, device: torch.device, model: Any, spec: RunSpec) -> dict | None:
    import torch.distributed as dist

    from sempar.errors import InputError
    from sempar.runtime.dispatch import Comm
    from sempar.runtime.experts import load_local_experts
    from sempar.runtime.modes import CLOCKS, Batch, dispatcher

    placement = spec.placement.validate()
    if placement.num_devices != world:
        raise InputError(f"placement has {placement.num_devices} devices, the run {world} ranks")
    experts = load_local_experts(model, placement, rank)
    comm = Comm(rank, world, device, spec.timeout)
    _inject(comm, spec.fault)
    runner = dispatcher(spec.mode, model, experts, placement, comm, spec.rebatch)
    B = spec.input_ids.shape[0]
    rr = spec.request_rank if spec.request_rank is not None else torch.arange(B) % world
    batch = Batch(spec.input_ids.long(), torch.as_tensor(rr).long(), spec.targets, spec.priority)
    logits, secs, fwd_s = None, None, None
    for rep in range(max(1, spec.repeats)):
        runner.reset_clock()
        t0 = time.perf_counter()
        res = runner.forward(batch)
        dt = time.perf_counter() - t0
        if rep == 0:
            logits, counted = res, {key: v.copy() for key, v in comm.bytes.items()}
        got = runner.clock.seconds
        secs = got if secs is None else {k: np.minimum(secs[k], got[k]) for k in CLOCKS}
        fwd_s = dt if fwd_s is None else min(fwd_s, dt)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (counted, secs, fwd_s))
    if rank != 0:
        return None
    full = {}
    for key in sorted({k for g in gathered for k in g[0]}):
        m = np.zeros((world, world), np.int64)
        for src, g in enumerate(gathered):
            if key in g[0]:
                m[src] = g[0][key]
        full[key] = m
    return {"logits": None if logits is None else logits.cpu(), "bytes": full,
            "rank_seconds": {k: np.stack([g[1][k] for g in gathered]) for k in CLOCKS},
            "forward_seconds": float(max(g[2] for g in gathered))}


def run_many(specs: list[RunSpec], world: int, deadline: float = 300.0,
             grace: float | None = None, threads: int = 1) -> list[RunResult]:
    """Spawn `world` local ranks once and run every spec in turn (one process group, each
    model loaded once); raises `RankFailure` when a rank fails."""
    if not specs:
        return []
    timeout = max(s.timeout for s in specs)
    res = launch(rank_main, world, (list(specs),), deadline=deadline,
                 grace=timeout + 10 if grace is None else grace, threads=threads)[0]
    return [RunResult.from_rank0(r, world, s.mode) for r, s in zip(res, specs)]


def run(spec: RunSpec, world: int, deadline: float = 180.0, grace: float | None = None,
        threads: int = 1) -> RunResult:
    """Spawn `world` local ranks and run `spec`; raises `RankFailure` when a rank fails."""
    return run_many([spec], world, deadline, grace, threads)[0]


def reference_logits(model: str, input_ids: torch.Tensor) -> torch.Tensor:
    """float32[B, S, V]: the single-process HF forward (the lossless reference)."""
    from sempar.models import load_model

    m = load_model(model)
    with torch.no_grad():
        return m(input_ids=input_ids.long()).logits.float()
