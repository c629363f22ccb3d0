"""The simulator: trace + placement + homes + topology + pipeline -> bytes per pair and seconds.

Per batch of `batch` consecutive tokens (2,048 by default, docs/design.md's tp batch) and per MoE
layer, the pipeline's collectives (pipelines.py) become byte matrices float64[G, G]; their time:

- all-to-all phases (metadata, dispatch, combine): CAMoE eq. 9, max over directed pairs of
  alpha + beta * bytes for that phase;
- rings (AR / RS / AG): steps x the slowest ring edge (collectives.ring_seconds), over the
  batch's rows, or over G x the largest chunk when the tp homes' chunks are uneven (a chunk
  slack, `capacity.slack_shares`): the shuffled RS of the attention output and the AG of the
  MoE output padded to the largest chunk, as equal-count collectives need (`ring_buffer`);

that is the `nccl` collective model (collective_models.py), the papers' engines; the `gloo`
model (our runtime, chosen by `SimOptions.collectives` or a topology profiled with gloo's
all-to-all) prices every phase below by its serialised all-to-all and the AR / RS / AG as the
direct all-to-alls the runtime sends;
- `smoe-exact`'s all-reduce of the [T, N] router logits: a direct two-shot all-reduce (RS then
  AG, each one all-to-all phase timed by eq. 9 with the dispatch parameters), the algorithm
  our runtime runs and the one small buffers want (a ring pays 2 (G - 1) latencies for them);
- ExFlow's all-gather of the new tokens: every device sends its tokens to every other, timed by
  eq. 9 with the dispatch parameters, charged at the last layer; `exflow-prefill`'s all-gather of
  the held context, every layer, the same way (+ its size exchange, one more eq. 9 phase).

A layer's `a2a_seconds` is metadata + dispatch + combine (eq. 9); `comm_seconds` adds the rings.
Per batch these are summed over layers (one pass of the batch through the model); the report
gives their mean and p95 over batches, and per layer the mean over batches.

The serving replica of an activation is the one nearest to the token's home under the
topology (cost of one hidden vector on the dispatch links; home first, ties to the lower id:
`placement.serving.cost_order`, the node order of the evaluator and the runtime where the links
follow the placement's nodes).
LAR and remote copies (docs/design.md): over (token, layer, expert) the share served on the home
device, and per (token, layer) the distinct remote devices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sempar.comm.collective_models import collective_model
from sempar.comm.collectives import all_to_all_volume, gather_held, route_counts, size_exchange
from sempar.comm.pipelines import Pipeline
from sempar.comm.topology import PHASES, Topology
from sempar.errors import InputError
from sempar.placement import serving
from sempar.placement.capacity import BATCH
from sempar.placement.placement import Placement
from sempar.trace.presets import HIDDEN_SIZES

COLUMNS = PHASES + ("collectives",)


@dataclass
class SimOptions:
    """hidden: elements per token vector; dtype_bytes: 2 = bf16. dedup / one_shot: None = the
    pipeline's default. meta_bytes: per selected expert per copy (int32 id + fp32 weight);
    count_bytes: per expert in the separate metadata collective's counts (CAMoE's s_cnt).
    logit_bytes: per router logit in `smoe-exact`'s all-reduce (4: fp32, as the runtime).
    size_bytes: per directed pair, the size exchange before an all-to-all-v with unknown receive
    sizes (one-shot dispatch, `exflow-prefill`'s context all-gather; 0: not charged, as in the
    papers' models; 8: an int64, as our runtime). index_bytes: `exflow-prefill`'s global token
    index per dispatched copy and per gathered token (4: int32, as the runtime).
    collectives: the collective model's name (collective_models.py); None: the topology's."""

    hidden: int
    dtype_bytes: int = 2
    batch: int = BATCH
    dedup: bool | None = None
    one_shot: bool | None = None
    meta_bytes: int = 8
    count_bytes: int = 4
    count_sag: bool = True
    partial_combine: bool = True
    logit_bytes: int = 4
    size_bytes: int = 0
    index_bytes: int = 4
    collectives: str | None = None

    @property
    def token_bytes(self) -> int:
        return int(self.hidden) * int(self.dtype_bytes)


def runtime_options(hidden: int, batch: int) -> SimOptions:
    """The options under which the simulator counts what our runtime (sempar.runtime) sends for
    one forward of `batch` tokens: fp32 rows, de-duplicated one-shot dispatch, int64 size
    exchanges, int32 token indices (pipelines: sempar.bench.METHODS)."""
    return SimOptions(hidden=hidden, dtype_bytes=4, batch=batch, dedup=True, one_shot=True,
                      size_bytes=8, index_bytes=4)


def resolve_hidden(model: str, extra: dict | None = None, hidden: int | None = None) -> int:
    """Hidden size: `hidden` if given, else the trace metadata's, our tiny model's config.json,
    or the preset table; InputError when none is known."""
    if hidden is not None:
        if hidden < 1:
            raise InputError(f"--hidden: {hidden} is not a positive integer")
        return int(hidden)
    if extra and isinstance(extra.get("hidden_size"), int):
        return int(extra["hidden_size"])
    from sempar.paths import packaged_model_dir
    from sempar.safe_json import read_json_object

    d = packaged_model_dir(model)
    if d is not None and (d / "config.json").is_file():
        return int(read_json_object(d / "config.json", "model config.json")["hidden_size"])
    base = model.split(":")[-1]                                 # "synthetic:qwen3-30b-a3b"
    if base in HIDDEN_SIZES:
        return HIDDEN_SIZES[base]
    raise InputError(f"hidden size of model {model!r} is unknown: give --hidden")


def replica_table(placement: Placement, topo: Topology, nbytes: float) -> tuple[np.ndarray, bool]:
    """(table, by_home): int16[L, N] device of each expert when none is replicated (by_home
    False), else int16[L, G, N] the replica nearest to each home device: `placement.serving`'s
    cost order under the dispatch cost of `nbytes` (home, then the cheapest link, ties to the
    lower id), not the evaluator's and runtime's node order; the two agree when the topology's
    links are uniform inside and between its nodes and its nodes are the placement's."""
    hosts = placement.hosts()                                   # [L, G, N]
    if (hosts.sum(axis=1) == 1).all():
        return hosts.argmax(axis=1).astype(np.int16), False
    order = serving.cost_order(topo.pair_cost("dispatch", nbytes))
    return np.stack([serving.table(h, order) for h in hosts]).astype(np.int16), True


def logit_all_reduce(ntok: np.ndarray, G: int, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(RS, AG) float64[batches, G, G]: bytes per directed pair of a direct (two-shot) all-reduce
    of [ntok, row_bytes] per batch, as `runtime.dispatch.Comm.all_reduce` sends it: row chunks
    T // G (the first T % G one more); RS sends chunk d to device d, AG device s's chunk to all."""
    n = np.asarray(ntok, np.int64)
    chunks = (n[:, None] // G + (np.arange(G)[None, :] < (n % G)[:, None])) * float(row_bytes)
    off = 1.0 - np.eye(G)
    rs = chunks[:, None, :] * off[None]              # [b, src, dst] = chunk of dst
    ag = chunks[:, :, None] * off[None]              # [b, src, dst] = chunk of src
    return rs, ag


def ring_buffer(home: np.ndarray, batch: np.ndarray, ntok: np.ndarray, G: int) -> np.ndarray:
    """float64[B]: rows of each batch's reduce-scatter / all-gather buffer when the chunks are
    the homes int[T] (batch int[T], ntok float[B] tokens per batch). Equal shares (largest chunk
    <= ceil(n / G)): n, the even ring. Larger chunks (`capacity.slack_shares`): G x the largest,
    the padded form NCCL needs (ncclReduceScatter / ncclAllGather take one count for every rank),
    so the largest chunk sets every ring step."""
    n = np.asarray(ntok, np.float64)
    chunks = np.bincount(np.asarray(batch, np.int64) * G + home,
                         minlength=n.size * G).reshape(n.size, G).max(axis=1)
    return np.where(chunks <= np.ceil(n / G), n, G * chunks.astype(np.float64))


def simulate(experts: np.ndarray, home: np.ndarray | None, placement: Placement, topo: Topology,
             pipeline: Pipeline, opts: SimOptions, served: np.ndarray | None = None) -> dict:
    """Bytes and seconds of `pipeline` for routing `experts` int[T, L, k] with homes
    `home` int[T, L] (for exflow only column 0 is used; None for pipelines without EP).
    served: int[T, L, k] the device serving each activation (a dispatch rule's choice among
    replicas, `placement.dispatch`, batches of `opts.batch` tokens); None: the copy nearest to
    the home (`replica_table`). Chained pipelines (ExFlow) always serve from the nearest copy.

    Returns {"layers": [...], "total": {...}, "per_batch": {"a2a_seconds": float[B],
    "comm_seconds": float[B]}, "bytes_per_pair": float64[L, 4, G, G]} (columns: metadata,
    dispatch, combine, collectives; summed over batches)."""
    T, L, k = experts.shape
    G = topo.num_devices
    if placement.num_devices != G:
        raise InputError(f"placement has {placement.num_devices} devices, topology {topo.name} "
                         f"has {G}")
    if placement.num_layers != L:
        raise InputError(f"placement has {placement.num_layers} layers, the trace {L}")
    if T == 0:
        raise InputError("the trace holds no tokens to simulate")
    H = opts.token_bytes
    B = int(opts.batch)
    if B < 1:
        raise InputError(f"--batch: {B} is not a positive integer")
    nb = -(-T // B)
    batch_of = np.arange(T, dtype=np.int64) // B
    ntok = np.bincount(batch_of, minlength=nb).astype(np.float64)
    dedup = pipeline.dedup if opts.dedup is None else opts.dedup
    one_shot = pipeline.one_shot if opts.one_shot is None else opts.one_shot
    context = "AG-context" in pipeline.steps
    meta = k * opts.meta_bytes + (opts.index_bytes if context else 0)
    header = placement.num_experts * opts.count_bytes

    secs = np.zeros((nb, L, len(COLUMNS)))
    pair_bytes = np.zeros((L, len(COLUMNS), G, G))
    lar = np.full(L, np.nan)
    copies = np.full(L, np.nan)
    ep = pipeline.expert_parallel
    cm = collective_model(topo, opts.collectives)
    pre_bytes, logit_ar = 0.0, None      # smoe-exact's logit all-reduce (inside "collectives")
    if ep:
        if home is None:
            raise InputError(f"pipeline {pipeline.name} needs token homes")
        table, by_home = replica_table(placement, topo, H)
        cur = np.asarray(home[:, 0], np.int32)
    for l in range(L):
        if ep:
            h = cur if pipeline.chained else np.asarray(home[:, l], np.int32)
            e = np.ascontiguousarray(experts[:, l, :])
            if served is not None and not pipeline.chained:     # the dispatch's copies
                cnt, cnt_dd, local = route_counts(h, np.ascontiguousarray(served[:, l, :]),
                                                  np.arange(G), False, batch_of, nb, G)
            else:
                cnt, cnt_dd, local = route_counts(h, e, table[l], by_home, batch_of, nb, G)
            lar[l] = local / (T * k)
            copies[l] = cnt_dd.sum() / T
            if dedup:
                cnt = cnt_dd
            disp = all_to_all_volume(cnt, H + (meta if one_shot else 0))
            mbytes = (size_exchange(nb, G, opts.size_bytes) if one_shot
                      else all_to_all_volume(cnt, meta, header, every_pair=True))
            if pipeline.chained:
                first = e[:, 0]
                nxt = (table[l][h, first] if by_home else table[l][first]).astype(np.int32)
                if k > 1 and opts.partial_combine:
                    # the other experts' outputs go to the top-1 expert's device (ExFlow)
                    ocnt, odd, _ = route_counts(nxt, e[:, 1:], table[l], by_home, batch_of, nb,
                                                G, dedup=dedup, lookup=h)
                    ccnt = (odd if dedup else ocnt).transpose(0, 2, 1)
                else:
                    ccnt = np.zeros_like(cnt)
                cur = nxt
            else:
                ccnt = cnt.transpose(0, 2, 1)
            comb = all_to_all_volume(ccnt, H)
            for i, b in enumerate((mbytes, disp, comb)):
                secs[:, l, i] = cm.a2a(topo, i, b)
                pair_bytes[l, i] = b.sum(axis=0)
        tp_homes = ep and pipeline.attention == "tp" and not pipeline.chained
        X = (ring_buffer(h, batch_of, ntok, G) if tp_homes else ntok) * H
        for step in pipeline.steps:
            if step in ("AR", "RS", "AG"):
                # the AG closing a pipeline that reduce-scattered its attention output is
                # s-MoE's shuffled AG, the one count_sag=False leaves out (pipelines.py)
                if step == "AG" and "RS" in pipeline.steps and not opts.count_sag:
                    continue
                secs[:, l, 3] += cm.collective(topo, step, X)
                pair_bytes[l, 3] += cm.pairs(step, G, X.sum())
            elif step == "AR-logits":
                if logit_ar is None:
                    logit_ar = logit_all_reduce(ntok, G, placement.num_experts * opts.logit_bytes)
                for phase in logit_ar:                                  # RS, then AG
                    secs[:, l, 3] += cm.a2a(topo, "dispatch", phase)
                    pair_bytes[l, 3] += phase.sum(axis=0)
                    pre_bytes += float(phase.sum())
            elif step == "AG-iteration" and l == L - 1 or step == "AG-context":
                held, row = (h, H + opts.index_bytes) if step == "AG-context" else (cur, H)
                for ag in ((gather_held(held, batch_of, nb, G, row),)
                           + ((size_exchange(nb, G, opts.size_bytes),) if context else ())):
                    secs[:, l, 3] += cm.a2a(topo, "dispatch", ag)
                    pair_bytes[l, 3] += ag.sum(axis=0)
    res = _report(pipeline, topo, secs, pair_bytes, lar, copies, T, nb, dedup, one_shot, opts)
    res["total"]["bytes_prerouting"] = pre_bytes
    return res


def _report(pipeline: Pipeline, topo: Topology, secs: np.ndarray, pair_bytes: np.ndarray,
            lar: np.ndarray, copies: np.ndarray, T: int, nb: int, dedup: bool, one_shot: bool,
            opts: SimOptions) -> dict:
    a2a_b = secs[:, :, :3].sum(axis=(1, 2))                    # per batch, all layers
    comm_b = secs.sum(axis=(1, 2))
    layers = []
    for l in range(secs.shape[1]):
        a2a_l = secs[:, l, :3].sum(axis=1)
        layers.append({
            "layer": l,
            "bytes": float(pair_bytes[l].sum()),
            "bytes_by_phase": {c: float(pair_bytes[l, i].sum()) for i, c in enumerate(COLUMNS)},
            "bytes_per_pair": pair_bytes[l].sum(axis=0),
            "a2a_seconds": float(a2a_l.mean()),
            "a2a_seconds_p95": float(np.percentile(a2a_l, 95)),
            "seconds_by_phase": {c: float(secs[:, l, i].mean()) for i, c in enumerate(COLUMNS)},
            "comm_seconds": float(secs[:, l].sum(axis=1).mean()),
            "lar": None if np.isnan(lar[l]) else float(lar[l]),
            "remote_copies_per_token": None if np.isnan(copies[l]) else float(copies[l]),
        })
    total_bytes = float(pair_bytes.sum())
    ep = not np.isnan(lar).all()
    total = {
        "bytes": total_bytes,
        "bytes_by_phase": {c: float(pair_bytes[:, i].sum()) for i, c in enumerate(COLUMNS)},
        "bytes_per_pair": pair_bytes.sum(axis=(0, 1)),
        "bytes_per_token": total_bytes / T,
        "a2a_seconds_mean": float(a2a_b.mean()),
        "a2a_seconds_p95": float(np.percentile(a2a_b, 95)),
        "comm_seconds_mean": float(comm_b.mean()),
        "comm_seconds_p95": float(np.percentile(comm_b, 95)),
        "lar_mean": float(np.nanmean(lar)) if ep else None,
        "lar_p50": float(np.nanmedian(lar)) if ep else None,
        "remote_copies_per_token": float(np.nanmean(copies)) if ep else None,
        "tokens": int(T), "batches": int(nb),
    }
    return {"pipeline": pipeline.name, "topology": topo.name, "devices": topo.num_devices,
            "nodes": topo.num_nodes, "batch": opts.batch, "hidden": opts.hidden,
            "dtype_bytes": opts.dtype_bytes, "dedup": dedup if pipeline.expert_parallel else None,
            "metadata": ("one-shot" if one_shot else "separate") if pipeline.expert_parallel else None,
            "layers": layers, "total": total,
            "per_batch": {"a2a_seconds": a2a_b, "comm_seconds": comm_b},
            "bytes_per_pair": pair_bytes}


def summary(result: dict) -> dict:
    """The result without the bulky arrays (per-batch series, [L, 4, G, G] tensor)."""
    return {k: v for k, v in result.items() if k not in ("per_batch", "bytes_per_pair")}
