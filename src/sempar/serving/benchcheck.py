"""The serving forecast against real execution: the per-layer time the forecaster predicts for
`sempar bench`'s configuration beside what `bench` measured (issue 17's check "within 20 %").

`sempar bench` runs one prefill iteration per batch: `batch_size` requests of `seq` tokens of
the tiny model, G ranks, fp32, every position's logits computed; Attention-DP methods deal the
requests round-robin (or by Alg. 2) to the ranks, TP methods run the whole batch on one group.
The forecast of that iteration is the serving predictor (`forecast.Prepared.step_seconds`:
roofline compute + tabulated routed experts + `sempar.comm` communication on the held-out
split's real routing) for exactly that iteration shape, less the LM head (bench's layer clock
stops before it), divided by the model's layers.

Inputs the forecast needs from the machine, measured once (bench_serve_vs_bench.py):

- the topology: the testbed's links as `sempar profile` measured them (a Topology JSON), or the
  preset cut to G hosts with its bandwidth scaled as the testbed shapes it;
- compute: one single-process forward of a bench batch on this CPU. `calibrated_cpu` scales the
  `cpu` accelerator's FLOP/s and bandwidth by one factor so that the roofline of that whole
  batch on one device takes the measured time (ours: one factor for both, since a tiny fp32
  model on a CPU is bound by neither the peak nor the bandwidth but by per-operator overhead,
  which scales with the work about as both do).

Communication is priced as the runtime sends it (`RUNTIME_SIM`): de-duplicated one-shot
dispatch with its int64 size exchange, fp32 rows, and the collective model of the topology
(comm/collective_models.py): a topology profiled with `sempar profile --method
all_to_all_single` names `gloo` and its measured all-to-all serialisation, so every collective
is priced as the all_to_all_single the runtime issues (AR as direct RS + AG); `collectives`
overrides it (`nccl`: eq. 9 and rings, the papers' engines).

Each bench method maps to the serving variant with its placement, pipeline and scheduler
(`bench_variant`); the measured per-layer time is bench's `layer_seconds` when its JSON has it,
else `moe_layer_seconds` (a whole decoder layer, max over ranks, median over batches). Term by
term, as bench's clocks split a layer (`runtime.modes.CLOCKS`): `moe_block` = the forecast
all-to-alls (metadata, dispatch, combine) + routed experts; `attn_comm` = the other collectives
(TP AR / RS / AG, exflow's context all-gather, tp-exact's logit all-reduce); the rest of the
layer is the dense roofline (attention, norms, router).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sempar.comm.simulate import runtime_options
from sempar.errors import InputError
from sempar.serving.dims import ModelDims
from sempar.serving.hardware import ACCELERATORS, Accelerator
from sempar.serving.roofline import Roofline
from sempar.serving.steptable import MAX_S
from sempar.serving.systems import Variant

BENCH_DTYPE_BYTES = 4       # the runtime runs fp32
# what the runtime sends beyond the pipelines' defaults: comm.simulate.runtime_options's fields
RUNTIME_SIM = {f: getattr(runtime_options(1, 1), f)
               for f in ("dedup", "one_shot", "size_bytes", "index_bytes")}


def bench_variant(method: dict) -> Variant:
    """The serving variant of one `bench --json` method entry (placement, scheduling, pipeline)."""
    try:
        place, sched, pipe = method["placement"], method["scheduling"], method["pipeline"]
    except KeyError as e:
        raise InputError(f"bench JSON: a method lacks {e.args[0]!r}") from None
    if sched == "alg2":
        return Variant(place, pipe, "alg2", "online")
    if sched == "online":                       # tp-rebatch with the online schedulers
        return Variant(place, pipe, "alg2", "online")
    if sched in ("round-robin", "contiguous", "exact"):
        return Variant(place, pipe, "round-robin", "none")
    raise InputError(f"bench JSON: scheduling {sched!r} has no serving variant")


def measured_layer_seconds(method: dict) -> float:
    """Bench's per-layer seconds: `layer_seconds` if present, else `moe_layer_seconds`."""
    for key in ("layer_seconds", "moe_layer_seconds"):
        if method.get(key) is not None:
            return float(method[key])
    raise InputError("bench JSON: a method has neither layer_seconds nor moe_layer_seconds")


def bench_dims(dims: ModelDims) -> ModelDims:
    return replace(dims, dtype_bytes=BENCH_DTYPE_BYTES)


def iteration_inputs(instances: int, batch_size: int, seq: int) -> tuple[np.ndarray, ...]:
    """(prefill, decode, attn_ctx, kv_read, sampled) float64[1, instances] of one bench prefill:
    the requests dealt evenly to `instances` (DP ranks; 1 for TP), every position sampled."""
    if batch_size % instances:
        raise InputError(f"bench batch of {batch_size} requests does not split over "
                         f"{instances} ranks")
    per = batch_size // instances
    tok = np.full((1, instances), float(per * seq))
    ctx = np.full((1, instances), per * seq * (seq + 1) / 2)
    return tok, np.zeros_like(tok), ctx, tok.copy(), tok.copy()


def calibrated_cpu(dims: ModelDims, batch_size: int, seq: int, forward_seconds: float,
                   experts_active: int | None = None) -> Accelerator:
    """The `cpu` accelerator scaled so that the roofline of one bench batch on one device (all
    experts there) takes `forward_seconds`, the measured single-process forward."""
    if not forward_seconds > 0:
        raise InputError(f"measured forward seconds {forward_seconds} is not positive")
    base = ACCELERATORS.get("cpu")
    roof = Roofline(dims, base, 1, tp=False)
    t = float(roof.dense_seconds(*iteration_inputs(1, batch_size, seq))[0])
    L = dims.moe_layers
    copies = np.full((L, 1), float(batch_size * seq * dims.top_k))
    active = np.full((L, 1), float(experts_active or dims.num_experts))
    t += float(roof.expert_seconds(copies, active))
    k = t / forward_seconds
    return replace(base, name="cpu-measured", flops=base.flops * k, mem_bw=base.mem_bw * k)


def forecast_iteration(p, batch_size: int, seq: int) -> dict:
    """Seconds of one bench prefill iteration by the serving predictor of `p` (a Prepared),
    mean over the step table's samples: total, and its parts (communication, its all-to-alls,
    routed experts, the LM head, the rest of the dense roofline)."""
    inp = iteration_inputs(p.cfg.instances, batch_size, seq)
    i = np.arange(MAX_S)
    rep = [np.repeat(a, MAX_S, axis=0) for a in inp]
    total = p.step_seconds(*rep, i)
    n = float(batch_size * seq)
    comm, expert = p.table.lookup(np.full(MAX_S, n), i)
    head = p.roofline.dense_seconds(*inp) - p.roofline.dense_seconds(*inp[:4], 0 * inp[4])
    return {"seconds": float(np.mean(total)), "comm_seconds": float(np.mean(comm)),
            "head_seconds": float(head[0]),
            "a2a_seconds": float(np.mean(p.table.lookup_a2a(n, i))),
            "expert_seconds": float(np.mean(expert)),
            "dense_seconds": float(np.mean(total - comm - expert))}


def compare_bench(bench: dict, fc) -> dict:
    """{method: forecast vs measured} for every method of a `bench --json` object; `fc` is a
    Forecaster on the bench model's dev trace, its topology and calibrated accelerator, G hosts."""
    methods = bench.get("methods")
    if not isinstance(methods, dict) or not methods:
        raise InputError("bench JSON: no methods")
    if int(bench.get("hosts", -1)) != fc.G:
        raise InputError(f"bench JSON: {bench.get('hosts')} hosts, the topology has {fc.G} devices")
    B, S = int(bench["batch_size"]), int(bench["seq"])
    layers = fc.dims.moe_layers + fc.dims.dense_layers
    out = {}
    for name, m in methods.items():
        p = fc.prepare(bench_variant(m))
        f = forecast_iteration(p, B, S)
        meas = measured_layer_seconds(m)
        fl = (f["seconds"] - f["head_seconds"]) / layers      # bench's layer clock: no LM head
        moe = (f["a2a_seconds"] + f["expert_seconds"]) / layers
        attn = (f["comm_seconds"] - f["a2a_seconds"]) / layers
        out[name] = {"pipeline": m["pipeline"], "placement": m["placement"],
                     "forecast_layer_seconds": fl, "measured_layer_seconds": meas,
                     "ratio": fl / meas if meas > 0 else None,
                     "forecast_moe_block_seconds": moe,
                     "measured_moe_block_seconds": m.get("moe_block_seconds"),
                     "forecast_attn_comm_seconds": attn,
                     "measured_attn_comm_seconds": m.get("attn_comm_seconds"),
                     "forecast_a2a_layer_seconds": f["a2a_seconds"] / layers,
                     "forecast_comm_layer_seconds": f["comm_seconds"] / layers,
                     "forecast_compute_layer_seconds": (f["dense_seconds"] - f["head_seconds"]
                                                        + f["expert_seconds"]) / layers,
                     "forecast_forward_seconds": f["seconds"],
                     "forecast_head_seconds": f["head_seconds"],
                     "measured_forward_seconds": m.get("forward_seconds"),
                     "lar_forecast": p.table.lar, "lar_measured": m.get("lar_mean")}
    return out
