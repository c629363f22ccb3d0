"""Import per-token routing a user dumped as numpy arrays (`.npz` / `.npy`) as a `RoutingTrace`.

The given files form one namespace of arrays: an `.npz` contributes its keys, an `.npy` its
file stem (`experts.npy` -> `experts`); a name given twice is refused. Files are read with
`allow_pickle=False` (no code runs). Roles and the array names tried by default (`keys`
overrides one role; an empty name skips it):

| role            | default names                     | shape, dtype                                  |
| --------------- | --------------------------------- | --------------------------------------------- |
| experts         | experts                           | int[T, L, k], routed-expert ids (required)     |
| weights         | weights, probs                    | float[T, L, k], router weights of those ids    |
| token_id        | token_id, token_ids, input_ids    | int[T]                                        |
| request_offsets | request_offsets                   | int[R + 1]: rows of request r are [o[r], o[r+1]) |
| request_id      | request_id, request_ids           | int[T], one request per distinct value         |
| position        | position, positions               | int[T]                                        |
| domain          | domain                            | int[T] index into the names (-1 unknown), or str[T] |
| request_domain  | request_domain, request_category  | int[R] or str[R], per request                  |
| domain_names    | domains, categories               | str[D]                                        |
| layer_ids       | layer_ids                         | int[L], the model's layer number of each column |

Scalars in the files (`num_experts`, `top_k`, `shared_experts`, `num_layers`, `model`) describe
the model too. Rules:

- **Model name**: `model`, else the files' `model` scalar, else the `model_dir` folder's name,
  else the first file's stem.

- **Model shape**: each field from the first of: the caller's value (flags), the files' scalar,
  the preset named by `model` or the `model_dir` config.json (trace/hf_config.py); every source
  that gives it must agree (else one line naming both). Without any, num_experts is the largest
  id + 1, shared_experts 0, vocab_size the largest token id + 1 (1 without ids), layer_ids
  0..L-1. top_k is the experts' last axis.
- **Requests**: `request_offsets` (non-empty requests in row order) or per-token `request_id`
  (not both); without either, all rows are one request. Per-request arrays are indexed by the
  request's number (offsets) or id value (request_id: ids 0..R-1).
- **Positions**: given, else each row's index within its request, in row order.
- **Domains**: integer indices name `domain_names` (their decimal index without one); strings
  are their own names (empty string = unknown), listed in sorted order. Per token or per
  request, not both.
- **Slot order**: with weights, rows not already in decreasing weight order are re-sorted by
  decreasing weight (stable: tied slots keep their order), counted in `extra.resorted_rows`;
  without weights the slots are kept as given.
- **No token ids**: the trace says so (`TraceMeta.has_token_ids` False) and its `token_id`
  column is all zeros, so any method needing a token -> expert table refuses it.

Bad input raises `InputError` naming the array and row; the trace is written atomically by
`TraceWriter`, whose validation (range, duplicate expert in a top-k, weights) applies too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from sempar.errors import InputError
from sempar.trace.array_files import DEFAULT_KEYS, Arrays  # noqa: F401 (DEFAULT_KEYS re-exported)
from sempar.trace.io import TraceWriter
from sempar.trace.schema import TraceMeta

SCALARS = ("num_experts", "top_k", "shared_experts", "num_layers", "model")
SHAPE_FIELDS = ("num_experts", "top_k", "shared_experts", "vocab_size", "num_expert_groups",
                "topk_groups", "layer_ids", "num_hidden_layers", "model_type")
FLUSH_ROWS = 32768
INT32_MAX = int(np.iinfo(np.int32).max)


PROVENANCE_MAX = 500    # characters per provenance value: a line of text, not a document


def _provenance(given: dict[str, str]) -> dict[str, str]:
    """`given` checked: short printable strings, keys among licence / source / notes."""
    out = {}
    for k, v in given.items():
        if k not in ("licence", "source", "notes"):
            raise InputError(f"provenance: {k!r} is not one of licence, source, notes")
        if not isinstance(v, str) or not v.strip() or len(v) > PROVENANCE_MAX \
                or not v.isprintable():
            raise InputError(f"--{k}: expected one printable line of at most {PROVENANCE_MAX} "
                             "characters")
        out[k] = v
    return out


def _vector(a: np.ndarray, name: str, n: int, what: str, kind: str = "i") -> np.ndarray:
    """a as a 1-D array of n values of dtype kind `kind` ("i": integer, "s": integer or string)."""
    if a.ndim != 1 or a.shape[0] != n:
        raise InputError(f"{name}: shape {a.shape}, expected ({n},) ({what})")
    if a.dtype.kind in "iu" or (kind == "s" and a.dtype.kind in "US"):
        return np.asarray(a)
    raise InputError(f"{name}: dtype {a.dtype} is not an integer{' or string' if kind == 's' else ''} type")


def _check_int32(a: np.ndarray, name: str, what: str = "row") -> None:
    if a.size and (int(a.min()) < 0 or int(a.max()) > INT32_MAX):
        r = int(np.argmax((a < 0) | (a > INT32_MAX)))
        raise InputError(f"{name}: {what} {r}: value {int(a[r])} is not in [0, {INT32_MAX}]")


def _requests(arr: Arrays, keys: dict, T: int) -> tuple[np.ndarray, int, str]:
    """(request_id int32[T], R, how): per-request arrays index 0..R-1."""
    on, offs = arr.role("request_offsets", keys.get("request_offsets"))
    rn, rid = arr.role("request_id", keys.get("request_id"))
    if on and rn:
        raise InputError(f"{on} and {rn}: give request offsets or per-token request ids, not both "
                         f"(--request-id-key '' or --request-offsets-key '' drops one)")
    if on:
        if offs.ndim != 1 or offs.shape[0] < 2 or offs.dtype.kind not in "iu":
            raise InputError(f"{on}: shape {offs.shape} dtype {offs.dtype}, expected int[requests + 1]")
        o = offs.astype(np.int64)
        if o[0] != 0 or o[-1] != T:
            raise InputError(f"{on}: offsets run {int(o[0])}..{int(o[-1])}, expected 0..{T} "
                             f"(the experts' rows)")
        d = np.diff(o)
        if (d <= 0).any():
            r = int(np.argmax(d <= 0))
            raise InputError(f"{on}: request {r}: offsets {int(o[r])} -> {int(o[r + 1])} "
                             f"{'is empty' if d[r] == 0 else 'go backwards'}")
        if d.size - 1 > INT32_MAX:
            raise InputError(f"{on}: {d.size} requests do not fit int32 request ids")
        return np.repeat(np.arange(d.size, dtype=np.int32), d), int(d.size), on
    if rn:
        rid = _vector(rid, rn, T, "one per experts row")
        _check_int32(rid, rn)
        return rid.astype(np.int32), int(rid.max()) + 1, rn
    return np.zeros(T, np.int32), 1, "one request (no request arrays)"


def _positions(request_id: np.ndarray) -> np.ndarray:
    """int32[T]: each row's index among the earlier rows of its request."""
    order = np.argsort(request_id, kind="stable")
    srt = request_id[order]
    start = np.r_[0, np.flatnonzero(srt[1:] != srt[:-1]) + 1]
    runs = np.diff(np.r_[start, srt.size])
    pos = np.empty(srt.size, np.int64)
    pos[order] = np.arange(srt.size) - np.repeat(start, runs)
    return pos.astype(np.int32)


def _check_domain_count(name: str, n: int) -> None:
    """Domains are int16 codes in a trace: more names would wrap onto other domains."""
    if n > np.iinfo(np.int16).max:
        raise InputError(f"{name}: {n} domains do not fit int16 domain codes "
                         f"(at most {np.iinfo(np.int16).max})")


def _names(a: np.ndarray, name: str) -> np.ndarray:
    """A str array of names from a numpy str ('U') or bytes ('S') array: bytes must be UTF-8."""
    if a.dtype.kind == "U":
        return a.astype(str)
    out = []
    for i, b in enumerate(a.tolist()):
        try:
            out.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            raise InputError(f"{name}: entry {i}: {b[:40]!r} is not UTF-8 text") from None
    return np.asarray(out, dtype=str) if out else np.zeros(0, dtype=str)


def _codes(a: np.ndarray, name: str, names: list[str] | None, what: str) -> tuple[np.ndarray, list[str]]:
    """(int16 codes (-1 unknown), names) of a domain array: integers index `names`, strings
    are the names."""
    if a.dtype.kind in "US":
        s = _names(a, name)
        uniq = sorted(set(s.tolist()) - {""})
        _check_domain_count(name, len(uniq))
        lookup = {n: i for i, n in enumerate(uniq)}
        return np.array([lookup.get(x, -1) for x in s.tolist()], np.int16), uniq
    if names is None:
        _check_domain_count(name, int(a.max()) + 1 if a.size else 0)
        names = [str(i) for i in range(int(a.max()) + 1 if a.size else 0)]
    _check_domain_count(name, len(names))
    bad = (a < -1) | (a >= len(names))
    if bad.any():
        r = int(np.argmax(bad))
        raise InputError(f"{name}: {what} {r}: index {int(a[r])} names no domain "
                         f"({len(names)} names; -1 = unknown)")
    return a.astype(np.int16), names


def _domains(arr: Arrays, keys: dict, T: int, R: int, request_id: np.ndarray
             ) -> tuple[np.ndarray | None, list[str], str | None]:
    """(domain int16[T] or None, names, source) of the rows."""
    tn, tok = arr.role("domain", keys.get("domain"))
    qn, req = arr.role("request_domain", keys.get("request_domain"))
    if tn and qn:
        raise InputError(f"{tn} and {qn}: give per-token or per-request domains, not both")
    if not (tn or qn):
        return None, [], None
    nn, names_arr = arr.role("domain_names", keys.get("domain_names"))
    names = None
    if names_arr is not None:
        if names_arr.ndim != 1 or names_arr.dtype.kind not in "US":
            raise InputError(f"{nn}: shape {names_arr.shape} dtype {names_arr.dtype}, expected "
                             "a 1-D array of names")
        names = _names(names_arr, nn).tolist()
        dup = [n for n in names if names.count(n) > 1]
        if dup or "" in names:
            raise InputError(f"{nn}: name {(dup or [''])[0]!r} is {'listed twice' if dup else 'empty'}")
    if tn:
        codes, names = _codes(_vector(tok, tn, T, "one per experts row", "s"), tn, names, "row")
        return codes, names, tn
    codes, names = _codes(_vector(req, qn, R, f"one per request of {R}", "s"), qn, names, "request")
    return codes[request_id], names, qn


def _shape(sources: list[tuple[str, dict]], derived: dict) -> tuple[dict, dict]:
    """(value, source) of every SHAPE_FIELDS field: the first source giving it, checked against
    the later ones; `derived` fills the rest."""
    value, origin = {}, {}
    for label, src in sources:
        for f, v in src.items():
            if v is None:
                continue
            if f not in value:
                value[f], origin[f] = v, label
            elif value[f] != v:
                raise InputError(f"{f}: {value[f]!r} from {origin[f]} but {v!r} from {label}")
    for f, v in derived.items():
        value.setdefault(f, v)
        origin.setdefault(f, "derived")
    return value, origin


def _scalars(arr: Arrays) -> dict:
    out = {}
    for n in SCALARS:
        if n in arr:
            a = arr.get(n)
            if a.ndim != 0 or (a.dtype.kind not in "iu" and not (n == "model" and a.dtype.kind in "US")):
                raise InputError(f"{n} ({arr.where[n]}): {a.dtype}{list(a.shape)} is not a "
                                 f"{'name' if n == 'model' else 'scalar integer'}")
            out[n] = str(a) if n == "model" else int(a)
    return out


def import_arrays(paths: Sequence[str | os.PathLike], out_path: str | os.PathLike,
                  keys: dict[str, str] | None = None, model: str | None = None,
                  model_dir: str | os.PathLike | None = None, shape: dict[str, Any] | None = None,
                  progress: Callable[[int], Any] | None = None,
                  provenance: dict[str, str] | None = None) -> dict[str, Any]:
    """Convert the arrays of `paths` into a Parquet trace at `out_path` (module docstring).

    provenance: free-text facts about the data's origin (e.g. {"licence": "MIT", "source":
    "deepseek-ai/ESFT results/expert_scores/ at commit 579a771"}), kept in the trace's metadata
    as `extra.provenance` so a copied trace still names its licence and source.

    keys: role -> array name (DEFAULT_KEYS' roles; "" skips the role); shape: SHAPE_FIELDS
    given by the caller (flags), None values ignored. `progress(n)` is called per block of rows
    written. Returns a summary dict."""
    from sempar.trace.presets import PRESETS

    keys = dict(keys or {})
    unknown = set(keys) - set(DEFAULT_KEYS)
    if unknown:
        raise InputError(f"keys: {sorted(unknown)} are not roles ({', '.join(DEFAULT_KEYS)})")
    arr = Arrays(paths)
    en, experts = arr.role("experts", keys.get("experts"))
    if en is None:
        raise InputError(f"experts: no such array (the files hold: {', '.join(sorted(arr.where))}; "
                         "--experts-key names it)")
    if experts.ndim != 3 or experts.dtype.kind not in "iu":
        raise InputError(f"{en}: shape {experts.shape} dtype {experts.dtype}, expected "
                         "int[tokens, layers, top_k]")
    T, L, k = experts.shape
    if T == 0 or L == 0 or k == 0:
        raise InputError(f"{en}: shape {experts.shape} holds no routing (tokens, layers and "
                         "top_k must be at least 1)")
    if experts.size and int(experts.min()) < 0:     # before a shape is derived from the ids
        r, l, sl = (int(i) for i in np.argwhere(np.asarray(experts) < 0)[0])
        raise InputError(f"{en}: row {r} layer {l} slot {sl}: expert id {int(experts[r, l, sl])} "
                         "is negative")
    scal = _scalars(arr)
    if "num_layers" in scal and scal["num_layers"] != L:
        raise InputError(f"num_layers ({arr.where['num_layers']}): {scal['num_layers']} but {en} "
                         f"has {L} layers")
    tn, token_id = arr.role("token_id", keys.get("token_id"))
    if tn:
        token_id = _vector(token_id, tn, T, "one per experts row")
        _check_int32(token_id, tn)
    ln, lids = arr.role("layer_ids", keys.get("layer_ids"))
    file_shape = {f: scal.get(f) for f in ("num_experts", "top_k", "shared_experts")}
    if ln:
        file_shape["layer_ids"] = tuple(int(i) for i in _vector(lids, ln, L, f"one per layer of {en}"))
    sources = [("the options", dict(shape or {})), ("the files", file_shape)]
    name = model or scal.get("model") or Path(paths[0]).stem
    if model_dir is not None:
        from sempar.trace.hf_config import config_shape

        cfg = config_shape(model_dir)
        if cfg.get("layer_ids") is not None and len(cfg["layer_ids"]) != L:
            raise InputError(f"--model-dir {model_dir}: config.json has {len(cfg['layer_ids'])} MoE "
                             f"layers, {en} has {L}")
        sources.append((f"{model_dir}/config.json", cfg))
        name = model or scal.get("model") or Path(model_dir).resolve().name
    elif model is not None and model in PRESETS:
        p = PRESETS.get(model)
        sources.append((f"preset {model}", {f: getattr(p, f) for f in SHAPE_FIELDS}))
    max_id = int(experts.max()) if experts.size else 0
    derived = {"num_experts": max_id + 1, "top_k": k, "shared_experts": 0,
               "vocab_size": int(token_id.max()) + 1 if tn and T else 1}
    value, origin = _shape(sources, derived)
    if value["top_k"] != k:
        raise InputError(f"top_k: {value['top_k']} from {origin['top_k']} but {en} holds {k} "
                         "experts per token and layer")
    if value.get("layer_ids") is not None and len(value["layer_ids"]) != L:
        raise InputError(f"layer_ids: {origin['layer_ids']} lists {len(value['layer_ids'])} "
                         f"layers, {en} has {L}")
    request_id, R, req_how = _requests(arr, keys, T)
    pn, position = arr.role("position", keys.get("position"))
    if pn:
        position = _vector(position, pn, T, "one per experts row")
        _check_int32(position, pn)
    else:
        position = _positions(request_id)
    domain, domains, dom_src = _domains(arr, keys, T, R, request_id)
    wn, weights = arr.role("weights", keys.get("weights"))
    if wn and (weights.shape != experts.shape or weights.dtype.kind != "f"):
        raise InputError(f"{wn}: shape {weights.shape} dtype {weights.dtype}, expected float "
                         f"{experts.shape} like {en}")
    meta = TraceMeta(
        model=name, num_layers=L, num_experts=int(value["num_experts"]), top_k=k,
        vocab_size=int(value["vocab_size"]), shared_experts=int(value["shared_experts"]),
        num_expert_groups=int(value.get("num_expert_groups") or 1),
        topk_groups=int(value.get("topk_groups") or value.get("num_expert_groups") or 1),
        layer_ids=value.get("layer_ids"), num_hidden_layers=value.get("num_hidden_layers"),
        model_type=value.get("model_type"), has_token_ids=tn is not None,
        slots_sorted=wn is not None,        # re-sorted by weight below; else unknown
        extra={"importer": "sempar.import_arrays", "files": [Path(p).name for p in paths],
               "arrays": {r: n for r, n in (("experts", en), ("weights", wn), ("token_id", tn),
                                            ("requests", req_how), ("position", pn),
                                            ("domain", dom_src)) if n},
               "ignored_arrays": sorted(set(arr.where) - arr.used),
               "shape_from": {f: origin[f] for f in sorted(origin)},
               "token_ids": "given" if tn else "none: the token_id column is all zeros",
               "positions": "given" if pn else "derived: index within the request",
               **({"provenance": _provenance(provenance)} if provenance else {})})
    resorted = 0
    with TraceWriter(out_path, meta, domains if domain is not None else None,
                     has_weights=wn is not None) as w:
        for lo in range(0, T, FLUSH_ROWS):
            sl = slice(lo, lo + FLUSH_ROWS)
            e = np.asarray(experts[sl])
            wt = None
            if wn:
                wt = np.asarray(weights[sl], np.float32)
                unsorted = (np.diff(wt, axis=2) > 0).any(axis=(1, 2))
                if unsorted.any():          # rows out of weight order: slot 0 must be the top-1
                    resorted += int(unsorted.sum())
                    order = np.argsort(-wt, axis=2, kind="stable")
                    wt = np.take_along_axis(wt, order, axis=2)
                    e = np.take_along_axis(e, order, axis=2)
            w.write(np.zeros(e.shape[0], np.int32) if tn is None else token_id[sl],
                    request_id[sl], position[sl], e,
                    None if domain is None else domain[sl], wt)
            if progress is not None:
                progress(e.shape[0])
        meta.extra["resorted_rows"] = resorted
        meta.extra["slot_order"] = ("by decreasing weight" if wn else
                                    "as given (no weights to check it against)")
    return {"out": str(out_path), "tokens": T, "requests": int(np.unique(request_id).size),
            "layers": L,
            "experts": meta.num_experts, "top_k": k, "model": meta.model,
            "has_token_ids": meta.has_token_ids, "has_weights": wn is not None,
            "domains": domains if domain is not None else [], "resorted_rows": resorted,
            "ignored_arrays": meta.extra["ignored_arrays"]}
