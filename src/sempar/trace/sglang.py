"""Import SGLang expert-distribution dumps (`per_token` mode) as a `RoutingTrace`.

SGLang (`--expert-distribution-recorder-mode per_token`, then the `/start_...`, `/stop_...`
and `/dump_expert_distribution_record` endpoints) writes one `.pt` file per rank,
`expert_distribution_recorder_<time>_<rank>.pt`, holding (python/sglang/srt/eplb/
expert_distribution.py, `_DetailSinglePassGatherer` + `_DetailAccumulator`)::

    {"records": [                          # one per forward pass on that rank, in order
        {"forward_pass_id": int, "rank": int, "gatherer_key": str,
         "input_ids": list[int] | int[T],  # SGLang stores python lists
         "positions": list[int] | int[T],
         "extend_seq_lens": list[int] | None,   # per-sequence lengths of an extend batch
         "forward_mode": int,
         "topk_ids_of_layer": int32[L, T, K],   # PHYSICAL expert ids, layer-major; K = 8
                                                # (DeepSeek-V3's top-k): unused slots and
                                                # layers without a router (dense) stay -1
         "misc_objects": list, "global_physical_count": int[L, P]}, ...],
     "last_physical_to_logical_map": int[L, P]}   # physical slot -> logical expert

L is the model's layer count (all layers, dense ones included) and P the number of physical
expert slots (logical experts + redundant replicas, EPLB). This module reads such files with
`torch.load(weights_only=True)` (no code runs), validates them (missing key, wrong shape, id out
of range -> `InputError` naming file, record, field) and converts them:

- **Layers**: a layer whose ids are -1 in every record is dense and left out; the others are the
  trace's L columns, their model indices in `TraceMeta.layer_ids`; the dump's layer count is
  the model's `num_hidden_layers`. `model` naming a preset adds its `model_type` (its layer
  layout must be the dump's).
- **top-k**: the number of leading slots used in the MoE layers (or `top_k`, checked).
- **Physical -> logical** with each file's `last_physical_to_logical_map`, per layer. SGLang calls
  it the *last* map: if EPLB rebalanced during the recording, earlier passes used another map
  that the dump does not keep.
- **-1 ids inside the top-k of a MoE layer** (a token the layer did not route) are an error by
  default (`on_incomplete="error"`); `on_incomplete="drop"` drops those tokens instead and counts
  them in `extra.dropped_tokens`.
- **Requests**: the dump has no request ids, so they are derived: every record starts a new
  request; inside a record, a decode pass (`forward_mode` 2, SGLang's ForwardMode.DECODE) holds
  one token per sequence, so each token is its own request; otherwise `extend_seq_lens` (when
  the record has it) gives the sequences, and failing that a new request starts wherever the
  position does not follow the previous one (`positions[t] != positions[t-1] + 1`, which covers
  a reset to 0). Decoded tokens therefore cannot be joined to their prompt (no request ids in
  the dump), and a chunked prefill's later chunks are new requests.
  Positions are kept as dumped (a continued sequence keeps its absolute positions).
- **Slot order** is SGLang's top-k order (its grouped top-k uses `sorted=False`); the dump has no
  router weights, so slot 0 is NOT guaranteed to be the top-1 choice (`extra.slot_order`).
- **Ranks**: files are concatenated in rank order (records in forward-pass order), each rank's
  records being distinct requests (attention-DP: every DP rank serves its own requests). Under
  attention-TP all ranks record the same tokens with the same routing; such duplicates (a record
  with the same forward_pass_id, tokens, positions and logical experts as one of a lower rank) are
  dropped unless `dedup=False` (`extra.duplicate_records_dropped`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from sempar.errors import InputError
from sempar.trace.io import TraceWriter
from sempar.trace.schema import TraceMeta
from sempar.trace.sglang_dump import (MAP_KEY, dump_map, load_dump, logical_ids,
                                      read_record, request_starts, scan_dump)

FLUSH_ROWS = 32768
INT32_MAX = int(np.iinfo(np.int32).max)


def _model_type(model: str | None, layer_ids: tuple[int, ...], L: int) -> str | None:
    """The preset's `model_type` when `model` names a preset whose layer layout the dump has."""
    from sempar.trace.presets import PRESETS

    if model is None or model not in PRESETS.names():
        return None
    preset = PRESETS.get(model)
    if (preset.num_hidden_layers, preset.layers) != (L, layer_ids):
        raise InputError(f"--model {model}: the preset has MoE layers {preset.layers[0]}.."
                         f"{preset.layers[-1]} of {preset.num_hidden_layers}, the dumps "
                         f"{layer_ids[0]}..{layer_ids[-1]} of {L}")
    return preset.model_type


def import_sglang(dump_paths: Sequence[str | os.PathLike], out_path: str | os.PathLike,
                  model: str | None = None, num_experts: int | None = None,
                  top_k: int | None = None, vocab_size: int | None = None,
                  on_incomplete: str = "error", dedup: bool = True,
                  progress: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Convert SGLang per_token dumps (one .pt per rank) into a Parquet trace at `out_path`.

    `num_experts` defaults to max(map) + 1, `vocab_size` to max(input id) + 1, `top_k` to the
    slots the MoE layers use, `model` to "sglang-dump". Two passes over the files (scan, then
    convert), one file in memory at a time. `progress(n)` is called per record with its tokens.
    Returns a summary dict.
    """
    if on_incomplete not in ("error", "drop"):
        raise InputError(f"on_incomplete: {on_incomplete!r} is not 'error' or 'drop'")
    paths = [Path(p) for p in dump_paths]
    if not paths:
        raise InputError("no SGLang dump given")
    infos = [scan_dump(p) for p in paths]
    L = infos[0].L
    for inf in infos[1:]:
        if inf.L != L:
            raise InputError(f"{inf.path}: {MAP_KEY} has {inf.L} layers, {infos[0].path} has {L}")
    ranks = [inf.rank for inf in infos]
    known = [r for r in ranks if r is not None]
    if len(set(known)) != len(known):
        dup = next(r for r in known if known.count(r) > 1)
        raise InputError(f"rank {dup}: given twice ({', '.join(str(i.path) for i in infos if i.rank == dup)})")
    # rank order; files without a rank keep their place after the ranked ones
    infos = sorted(infos, key=lambda i: (i.rank is None, i.rank if i.rank is not None else 0))

    active = np.zeros(L, bool)
    for inf in infos:
        active |= inf.active
    layer_ids = tuple(int(l) for l in np.flatnonzero(active))
    if not layer_ids:
        raise InputError("the dumps hold no routed token (every topk_ids_of_layer is empty or -1)")
    slots = max(inf.slots for inf in infos)
    if top_k is None:
        top_k = slots
    elif top_k != slots:
        raise InputError(f"--top-k {top_k}: the MoE layers of the dumps use {slots} expert "
                         "slots per token")
    map_max = max(inf.map_max for inf in infos)
    if num_experts is None:
        num_experts = map_max + 1
    elif num_experts <= map_max:
        raise InputError(f"--num-experts {num_experts}: {MAP_KEY} names logical expert {map_max}")
    max_token = max(inf.max_token for inf in infos)
    if vocab_size is None:
        vocab_size = max_token + 1
    elif vocab_size <= max_token:
        raise InputError(f"--vocab-size {vocab_size}: the dumps hold token id {max_token}")

    # de-duplicate attention-TP copies: the same pass on a lower rank wins
    keep: list[list[bool]] = []
    seen: set[bytes] = set()
    dropped_dups = 0
    for inf in infos:
        ks = []
        for key in inf.keys:
            if key is None:
                ks.append(False)
            elif dedup and key in seen:
                ks.append(False)
                dropped_dups += 1
            else:
                seen.add(key)
                ks.append(True)
        keep.append(ks)

    by_mode: dict[str, int] = {}
    for inf, ks in zip(infos, keep):
        for (mode, T), k in zip(inf.modes, ks):
            if k:
                by_mode[mode] = by_mode.get(mode, 0) + T
    meta = TraceMeta(
        model=model or "sglang-dump", num_layers=len(layer_ids), num_experts=int(num_experts),
        top_k=int(top_k), vocab_size=int(vocab_size), layer_ids=layer_ids,
        num_hidden_layers=L, model_type=_model_type(model, layer_ids, L), slots_sorted=False,
        extra={"importer": "sempar.import_sglang", "source": "sglang per_token dump",
               "files": [inf.path.name for inf in infos], "ranks": [inf.rank for inf in infos],
               "slot_order": "engine (SGLang top-k order, not sorted by weight; no weights)",
               "requests": "derived: new record, decode token, extend_seq_lens, or positions "
                           "not consecutive",
               "dedup": dedup, "on_incomplete": on_incomplete,
               "records": sum(sum(ks) for ks in keep),
               "duplicate_records_dropped": dropped_dups,
               "tokens_by_forward_mode": by_mode})
    lids = np.asarray(layer_ids)
    state = {"request": 0, "tokens": 0, "dropped_tokens": 0, "records": 0, "requests": 0}
    buf: dict[str, list[np.ndarray]] = {"tok": [], "req": [], "pos": [], "exp": []}
    buffered = [0]

    def flush(w: TraceWriter) -> None:
        if buffered[0]:
            w.write(*(np.concatenate(buf[k]) for k in ("tok", "req", "pos", "exp")))
            for v in buf.values():
                v.clear()
            buffered[0] = 0

    with TraceWriter(out_path, meta) as writer:
        for inf, ks in zip(infos, keep):
            obj = load_dump(inf.path)
            pmap = dump_map(obj, inf.path)
            for i, raw in enumerate(obj["records"]):
                if not ks[i]:
                    continue
                r = read_record(raw, i, inf.path, inf.L, inf.P)
                T = r.input_ids.shape[0]
                if r.topk.shape[2] < top_k:
                    raise InputError(f"{inf.path}: record {i}: topk_ids_of_layer: {r.topk.shape[2]} "
                                     f"slots, fewer than top-k {top_k}")
                phys = r.topk[lids][:, :, :top_k]
                logical = np.transpose(logical_ids(phys, pmap[lids]), (1, 0, 2))  # [T, L', k]
                missing = (logical < 0).any(axis=2)                          # [T, L']
                ok = ~missing.any(axis=1)
                if not ok.all():
                    t, l = (int(x) for x in np.argwhere(missing)[0])
                    if on_incomplete == "error":
                        raise InputError(f"{inf.path}: record {i}: topk_ids_of_layer: layer "
                                         f"{layer_ids[l]} token {t}: -1 (no expert) inside the "
                                         f"top-{top_k} of a MoE layer")
                srt = np.sort(logical, axis=2)
                dup = ((srt[:, :, 1:] == srt[:, :, :-1]) & (srt[:, :, 1:] >= 0)).any(axis=2)
                if dup.any():
                    t, l = (int(x) for x in np.argwhere(dup)[0])
                    raise InputError(f"{inf.path}: record {i}: topk_ids_of_layer: layer "
                                     f"{layer_ids[l]} token {t}: physical ids "
                                     f"{phys[l, t].tolist()} map to a repeated logical expert "
                                     f"{logical[t, l].tolist()}")
                starts = request_starts(r.positions, r.seq_lens, r.forward_mode)
                req = state["request"] + np.cumsum(starts) - 1
                state["request"] += int(starts.sum())
                if state["request"] > INT32_MAX + 1:
                    raise InputError(f"{inf.path}: record {i}: more than {INT32_MAX + 1} requests "
                                     "do not fit int32 request ids")
                if not ok.all():
                    state["dropped_tokens"] += int((~ok).sum())
                state["requests"] += int(np.unique(req[ok]).size)
                buf["tok"].append(r.input_ids[ok].astype(np.int32))
                buf["req"].append(req[ok].astype(np.int32))
                buf["pos"].append(r.positions[ok].astype(np.int32))
                buf["exp"].append(logical[ok].astype(meta.expert_dtype))
                n = int(ok.sum())
                buffered[0] += n
                state["tokens"] += n
                state["records"] += 1
                if buffered[0] >= FLUSH_ROWS:
                    flush(writer)
                if progress is not None:
                    progress(n)
            del obj
        flush(writer)
    return {"out": str(out_path), "tokens": state["tokens"], "requests": state["requests"],
            "records": state["records"], "duplicate_records_dropped": dropped_dups,
            "dropped_tokens": state["dropped_tokens"], "layers": meta.num_layers,
            "layer_ids": list(layer_ids), "experts": meta.num_experts, "top_k": meta.top_k,
            "vocab_size": meta.vocab_size, "ranks": [inf.rank for inf in infos],
            "model": meta.model}
