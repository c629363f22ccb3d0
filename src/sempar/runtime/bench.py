"""`sempar bench`: real EP prefill of the tiny 64-expert model, vanilla vs exflow vs sempar
(issue #7 item 4), on the namespace testbed (root) or over loopback.

Prefill batches are the dev trace's held-out requests (`split_by_request`, the 80 % not used to
fit), each cut to its first `seq` tokens: the dev text, already tokenized. Placements and the
online schedulers are fitted on the 20 % fit split. Methods (`METHODS`):

| name | placement | runtime mode | homes (simulator pipeline) |
| --- | --- | --- | --- |
| `vanilla` | contiguous experts | attn-dp, requests round-robin | request rank (`sglang-ep`) |
| `vanilla-tp` | contiguous experts | tp-allreduce | contiguous chunks (`ds-moe`) |
| `exflow` | exflow (ILP) | exflow, requests round-robin | top-1 chain (`exflow`) |
| `sempar-dp` | semmoe | attn-dp, requests by Sem-MoE Alg. 2 | request rank (`sglang-ep`) |
| `sempar-tp` | semmoe | tp-rebatch, targets from `OnlineScheduler.predict` | re-batched chunk (`smoe`) |
| `sempar-tp-exact` | semmoe | tp-exact, exact pre-routing (`schedule.prerouter`) | capacity-aligned home of the real experts (`smoe-exact`) |

`vanilla` (attention DP + EP, SGLang's default) is the baseline of every time ratio. TP methods
need the attention heads to split over G (tiny-moe64: 4 heads, so no TP at G = 8): skipped
otherwise. Per method and batch the runtime reports min over `repeats` forwards; the figures
are the median over batches (times), sums (bytes), mean (LAR) and max (logit diff).
`moe_layer_seconds` is the runtime's per-layer time (a whole decoder layer: attention, its
collectives and the MoE block, max over ranks), averaged over the layers.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sempar.atomic import scratch_folder
from sempar.errors import InputError

MODEL = "tiny-moe64"
METHODS = {   # name: (placement solver, runtime mode, request policy / scheduler, sim pipeline)
    "vanilla": ("vanilla", "attn-dp", "round-robin", "sglang-ep"),
    "vanilla-tp": ("vanilla", "tp-allreduce", "contiguous", "ds-moe"),
    "exflow": ("exflow", "exflow", "round-robin", "exflow"),
    "sempar-dp": ("semmoe", "attn-dp", "alg2", "sglang-ep"),
    "sempar-tp": ("semmoe", "tp-rebatch", "online", "smoe"),
    "sempar-tp-exact": ("semmoe", "tp-exact", "exact", "smoe-exact"),
}
BASELINE = "vanilla"
ENTRY = "sempar.runtime.bench:bench_rank"


def result_path() -> Path:
    """Where the last result is written: $SEMPAR_BENCH_RESULT or ~/.cache/sempar/bench-last.json."""
    env = os.environ.get("SEMPAR_BENCH_RESULT")
    return Path(env) if env else Path.home() / ".cache" / "sempar" / "bench-last.json"


def last_bench_result() -> dict | None:
    """The last `sempar bench` result (the --json object), or None when there is none / unreadable."""
    try:
        return json.loads(result_path().read_text())
    except (OSError, ValueError):
        return None


def bench_table_rows(result: dict) -> list[list[str]]:
    """Rows [method, mode, MoE layer ms, forward ms, x vanilla, dispatch+combine MB sent,
    predicted, MB of every collective, LAR, max |dlogit|] of a result, formatted for a table
    (the header is `TABLE_HEADER`)."""
    rows = []
    for name, m in result.get("methods", {}).items():
        rows.append([name, m.get("mode", ""), f"{m['moe_layer_seconds'] * 1e3:.1f}",
                     f"{m['forward_seconds'] * 1e3:.1f}",
                     "" if m.get("time_ratio") is None else f"{m['time_ratio']:.2f}",
                     _mb(m["bytes_sent"]), _mb(m["bytes_predicted"]),
                     _mb(m.get("bytes_total", float("nan"))), f"{m['lar_mean']:.3f}",
                     f"{m['max_abs_logit_diff']:.1e}"])
    return rows


TABLE_HEADER = ["method", "mode", "MoE layer ms", "forward ms", "x vanilla", "sent MB (d+c)",
                "predicted MB", "all MB", "LAR", "max |dlogit|"]


def _mb(b: float) -> str:
    return f"{b / 1e6:.3f}"


# ---- inputs ----------------------------------------------------------------------------------
def load_dev(model: str = MODEL):
    """(fit, held-out) splits of the packaged dev trace of `model`."""
    from sempar.paths import assets_dir
    from sempar.trace.io import read_trace
    from sempar.trace.ops import split_by_request

    path = assets_dir() / "traces" / f"{model}.parquet"
    if not path.is_file():
        raise InputError(f"no dev trace for {model} at {path}")
    return split_by_request(read_trace(path))


def prefill_batches(held, batches: int, batch_size: int, seq: int) -> list[torch.Tensor]:
    """`batches` int64[batch_size, seq]: held-out requests with >= seq tokens, in trace order,
    each cut to its first `seq` tokens."""
    order = np.argsort(held.request_id, kind="stable")
    rid = held.request_id[order]
    starts = np.flatnonzero(np.r_[True, rid[1:] != rid[:-1]])
    lens = np.diff(np.r_[starts, rid.size])
    first_seen = np.argsort([order[s] for s in starts], kind="stable")   # trace order
    rows = []
    for i in first_seen:
        if lens[i] >= seq:
            idx = order[starts[i]:starts[i] + lens[i]]
            idx = idx[np.argsort(held.position[idx], kind="stable")][:seq]
            rows.append(held.token_id[idx].astype(np.int64))
    need = batches * batch_size
    if len(rows) < need:
        raise InputError(f"the held-out dev text has {len(rows)} requests of >= {seq} tokens; "
                         f"{batches} x {batch_size} asked for")
    ids = torch.from_numpy(np.stack(rows[:need]))
    return list(ids.view(batches, batch_size, seq))


_MODELS: dict[str, Any] = {}


def reference(model: str, ids: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """(logits float32[B, S, V], experts int64[B*S, L, k]) of the single-process HF forward."""
    from transformers.utils import logging as hf_logging

    from sempar.trace.record import load_model
    from sempar.trace.routers import RoutingCapture, find_routers

    hf_logging.disable_progress_bar()
    if model not in _MODELS:
        _MODELS.clear()
        _MODELS[model] = load_model(model)
    m = _MODELS[model]
    cfg = m.config
    with RoutingCapture(find_routers(m), cfg.num_experts_per_tok,
                        cfg.num_local_experts) as cap, torch.no_grad():
        cap.expect(ids.numel())
        logits = m(input_ids=ids.long()).logits.float()
        experts, _ = cap.take()
    return logits, np.asarray(experts, np.int64)


def batch_trace(meta, ids: torch.Tensor, experts: np.ndarray):
    from sempar.trace.schema import RoutingTrace

    B, S = ids.shape
    return RoutingTrace(meta=meta, token_id=ids.reshape(-1).numpy().astype(np.int64),
                        request_id=np.repeat(np.arange(B, dtype=np.int64), S),
                        position=np.tile(np.arange(S, dtype=np.int64), B), experts=experts)


def tp_ok(model: str, G: int) -> bool:
    from sempar.trace.record import resolve_model

    cfg = json.loads((resolve_model(model).model_dir / "config.json").read_text())
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if nh % G:
        return False
    per = nh // G
    kv = len({h // (nh // nkv) for h in range(per)})
    return per % kv == 0


# ---- the rank side ---------------------------------------------------------------------------
def bench_rank(rank: int, world: int, specs_path: str, out_path: str) -> dict | None:
    """One testbed / loopback rank (process group already up, gloo): run every RunSpec of the
    pickle at `specs_path` in turn (model loaded once); rank 0 pickles the results to out_path."""
    from transformers.utils import logging as hf_logging

    from sempar.runtime.run import _run_one
    from sempar.trace.record import load_model

    hf_logging.disable_progress_bar()
    specs = pickle.loads(Path(specs_path).read_bytes())
    device = torch.device("cpu")
    models: dict[str, Any] = {}
    out = []
    if specs:   # warm-up forward (allocator, lazy imports), not timed
        models[specs[0].model] = load_model(specs[0].model)
        _run_one(rank, world, device, copy.deepcopy(models[specs[0].model]),
                 dataclasses.replace(specs[0], repeats=1))
    for spec in specs:
        if spec.model not in models:
            models[spec.model] = load_model(spec.model)
        out.append(_run_one(rank, world, device, copy.deepcopy(models[spec.model]), spec))
    if rank != 0:
        return None
    tmp = Path(out_path + ".tmp")
    tmp.write_bytes(pickle.dumps(out))
    os.replace(tmp, out_path)
    return {"specs": len(specs)}


# ---- one benchmark ---------------------------------------------------------------------------
def _uniform(G: int):
    from sempar.comm.topology import Topology

    return Topology("uniform", np.zeros(G, np.int32), np.zeros((G, G)),
                    np.ones((G, G)) - np.eye(G))


def _homes(mode: str, spec, L: int, experts: np.ndarray) -> np.ndarray:
    from sempar.schedule import homes

    B, S = spec.input_ids.shape
    T, G = B * S, spec.placement.num_devices
    if mode in ("attn-dp", "exflow"):
        return homes.home_from_ranks(np.repeat(np.arange(B), S), np.asarray(spec.request_rank), L)
    if mode == "tp-allreduce":
        return homes.home_tp_contiguous(T, G, L, batch=T)
    if mode == "tp-exact":
        return homes.oracle_home(spec.placement, experts, T)
    prio = spec.priority                                   # targets, priority: [L, T]
    return homes.rebatched_home(spec.targets.T, G, None if prio is None else prio.T, batch=T)


def predicted(spec, experts: np.ndarray, pipeline: str, hidden: int
              ) -> tuple[float, float, float, float]:
    """(dispatch bytes, combine bytes, LAR mean, pre-routing all-reduce bytes) of the comm
    simulator for the run's homes."""
    from sempar.comm.pipelines import PIPELINES
    from sempar.comm.simulate import SimOptions, simulate

    T, L, _ = experts.shape
    G = spec.placement.num_devices
    opts = SimOptions(hidden=hidden, dtype_bytes=4, batch=T, dedup=True, one_shot=True)
    res = simulate(experts, _homes(spec.mode, spec, L, experts), spec.placement, _uniform(G),
                   PIPELINES.get(pipeline), opts)
    bpp = res["bytes_per_pair"]
    return (float(bpp[:, 1].sum()), float(bpp[:, 2].sum()), float(res["total"]["lar_mean"]),
            float(res["total"]["bytes_prerouting"]))


def plan_specs(G: int, batches: list[torch.Tensor], methods: list[str], model: str = MODEL,
               repeats: int = 3, timeout: float = 60.0, progress=None):
    """(specs, per-spec context, fitted placements, skipped {method: why}) of a benchmark."""
    from sempar.placement import solve
    from sempar.runtime.run import RunSpec
    from sempar.schedule.online import OnlineScheduler, model_embedding

    say = progress or (lambda s: None)
    fit, _ = load_dev(model)
    skipped = {}
    if not tp_ok(model, G):
        for m in methods:
            if METHODS[m][1].startswith("tp"):
                skipped[m] = f"{model}'s attention heads do not split over {G} ranks"
    methods = [m for m in methods if m not in skipped]
    placements, scheds = {}, {}
    for m in methods:
        solver = METHODS[m][0]
        if solver not in placements:
            say(f"placement {solver} at G={G}")
            placements[solver] = solve(solver, fit, G)
        if METHODS[m][2] in ("alg2", "online") and solver not in scheds:
            say(f"online schedulers for {solver}")
            scheds[solver] = OnlineScheduler(oov=model_embedding(model)).fit(fit,
                                                                             placements[solver])
    specs, ctx = [], []
    for bi, ids in enumerate(batches):
        logits, experts = reference(model, ids)
        tr = batch_trace(fit.meta, ids, experts)
        B, S = ids.shape
        for m in methods:
            solver, mode, policy, _ = METHODS[m]
            rr, targets, prio = torch.arange(B) % G, None, None
            if policy == "alg2":
                rr = torch.from_numpy(scheds[solver].home_dp(tr, "alg2")[::S, 0].astype(np.int64))
            elif policy == "online":
                dev, conf = scheds[solver].predict(tr)
                targets = torch.from_numpy(np.ascontiguousarray(dev.T).astype(np.int64))
                prio = torch.from_numpy(np.ascontiguousarray(conf.T).astype(np.float32))
            specs.append(RunSpec(model, ids, placements[solver], mode, request_rank=rr,
                                 targets=targets, priority=prio, timeout=timeout,
                                 repeats=repeats))
            ctx.append({"method": m, "batch": bi, "experts": experts, "logits": logits})
    return specs, ctx, placements, skipped


def execute(specs: list, G: int, preset: str | None, scale: float, timeout_s: float,
            op_timeout_s: float = 60.0) -> list:
    """Run the specs on G testbed hosts (preset) or loopback ranks; RunResults in order."""
    from sempar.runtime.run import RunResult
    from sempar.testbed import netns
    from sempar.testbed.launch import launch

    with scratch_folder("sempar-bench-") as work:
        (work / "specs.pkl").write_bytes(pickle.dumps(specs))
        args = {"specs_path": str(work / "specs.pkl"), "out_path": str(work / "out.pkl")}
        kw = dict(timeout_s=timeout_s, op_timeout_s=op_timeout_s, grace_s=10.0)
        if preset:
            topo = netns.resolve_preset(preset, G)
            with netns.testbed(G, topo, scale, preset=preset, ttl_s=timeout_s + 120) as tb:
                launch(ENTRY, G, args, tb=tb, **kw)
        else:
            launch(ENTRY, G, args, **kw)
        raw = pickle.loads((work / "out.pkl").read_bytes())
    return [RunResult(r["logits"], r["bytes"], r["layer_seconds"], r["forward_seconds"], G,
                      s.mode) for r, s in zip(raw, specs)]


def run_bench(G: int = 4, preset: str | None = "pcie-upi8", scale: float = 1 / 8000,
              batches: int = 2, batch_size: int = 8, seq: int = 128, repeats: int = 3,
              methods: list[str] | None = None, model: str = MODEL, timeout_s: float = 600.0,
              save: bool = True, progress=None) -> dict:
    """Benchmark `methods` (default all) at G; the `bench --json` object. `preset` None or
    "none": loopback; a preset without root / netns falls back to loopback (result["note"])."""
    from sempar.testbed import netns

    methods = list(methods or METHODS)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise InputError(f"--methods: {', '.join(bad)} not among {', '.join(METHODS)}")
    if BASELINE not in methods:
        methods.insert(0, BASELINE)
    if min(batches, batch_size, seq, repeats) < 1:
        raise InputError("--batches, --batch-size, --seq and --repeats must be positive")
    if not 2 <= G <= 64:
        raise InputError(f"--hosts must be 2..64, got {G}")
    note = None
    if preset in (None, "", "none"):
        preset = None
    else:
        netns.shaped_rates(netns.resolve_preset(preset, G), scale)   # checks preset and scale
        ok, why = netns.netns_available()
        if not ok:
            note, preset = f"testbed unavailable ({why}): ran over loopback", None
    say = progress or (lambda s: None)
    _, held = load_dev(model)
    ids = prefill_batches(held, batches, batch_size, seq)
    specs, ctx, placements, skipped = plan_specs(G, ids, methods, model, repeats,
                                                 progress=progress)
    say(f"running {len(specs)} forwards x {repeats} on "
        f"{'testbed ' + preset if preset else 'loopback'}, G={G}")
    results = execute(specs, G, preset, scale, timeout_s)
    hidden = _hidden(model)
    per: dict[str, list[dict]] = {}
    for spec, c, r in zip(specs, ctx, results):
        L = c["experts"].shape[1]
        pd, pc, lar, pp = predicted(spec, c["experts"], METHODS[c["method"]][3], hidden)
        dc = r.dispatch_combine(L)
        per.setdefault(c["method"], []).append({
            "dispatch_sent": int(dc[:, 0].sum()), "dispatch_predicted": pd,
            "moe_layer_seconds": float(np.mean(r.layer_seconds)),
            "forward_seconds": float(r.forward_seconds),
            "bytes_sent": int(dc.sum()), "bytes_total": r.total(),
            "bytes_predicted": pd + pc, "lar_mean": lar,
            "prerouting_sent": r.total("prerouting"), "prerouting_predicted": pp,
            "max_abs_logit_diff": float((r.logits - c["logits"]).abs().max()),
            "logits_allclose": bool(torch.allclose(r.logits, c["logits"], rtol=1e-5, atol=1e-5))})
    out = {}
    for m, rows in per.items():
        solver, mode, policy, pipe = METHODS[m]
        col = lambda k: [x[k] for x in rows]  # noqa: E731
        out[m] = {"moe_layer_seconds": float(np.median(col("moe_layer_seconds"))),
                  "forward_seconds": float(np.median(col("forward_seconds"))),
                  "bytes_sent": int(sum(col("bytes_sent"))),
                  "bytes_predicted": float(sum(col("bytes_predicted"))),
                  "bytes_total": int(sum(col("bytes_total"))),
                  "dispatch_sent": int(sum(col("dispatch_sent"))),
                  "dispatch_predicted": float(sum(col("dispatch_predicted"))),
                  "prerouting_sent": int(sum(col("prerouting_sent"))),
                  "prerouting_predicted": float(sum(col("prerouting_predicted"))),
                  "lar_mean": float(np.mean(col("lar_mean"))),
                  "max_abs_logit_diff": float(max(col("max_abs_logit_diff"))),
                  "logits_allclose_1e-5": all(col("logits_allclose")),
                  "placement": solver, "mode": mode, "scheduling": policy, "pipeline": pipe,
                  "forward_seconds_per_batch": col("forward_seconds")}
    base = out[BASELINE]["forward_seconds"]
    for m in out.values():
        m["time_ratio"] = m["forward_seconds"] / base if base > 0 else None
    result = {"hosts": G, "preset": preset, "scale": scale if preset else None, "model": model,
              "transport": "testbed" if preset else "loopback",
              "batches": batches, "batch_size": batch_size, "seq": seq, "repeats": repeats,
              "baseline": BASELINE, "methods": out, "skipped": skipped}
    if note:
        result["note"] = note
    if save:
        from sempar.atomic import write_text_atomic

        write_text_atomic(result_path(), json.dumps(result, indent=1) + "\n")
    return result


def _hidden(model: str) -> int:
    from sempar.trace.record import resolve_model

    return int(json.loads((resolve_model(model).model_dir / "config.json").read_text())
               ["hidden_size"])
