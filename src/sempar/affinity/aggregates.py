"""Sempar's routing statistics on the real OLMoE / Mixtral routing aggregates (no per-token traces).

Input: a folder like ``shared/data/real/olmoe-routing-aggregates`` (its README) with, per model
prefix (``olmoe``: OLMoE-1B-7B-0924, N=64, k=8; ``mistral``: Mixtral-8x7B-v0.1, N=8, k=2;
``olmoe-sft`` / ``olmoe-dpo``: instruction-tuned OLMoE) and domain, for MoE layers 0, 7, 15 only:
``<model>_token_expert_counts_<domain>.npz``: ``layer{L}_token_id`` int32[n], ``layer{L}_expert``
int16[n], ``layer{L}_count`` int32[n] (Sem-MoE's token -> expert table T);
``<model>_expert_counts[_top1]_<domain>.npz``: ``layer{L}`` int64[N] selections per expert (all k
slots / top-1); ``<model>_expert_counts_crosslayer[_top1]_<domain>.npz``: ``layers{a}_{b}_pairs``
int64[rows, 3] = (expert at layer a, expert at layer b, count), each pair once.
Found in the files: a domain is 208,896 tokens (tulu 205,243); token files sum to tokens x k per
layer; crosslayer counts sum to tokens x k (tokens for ``_top1_``), so pairs are rank-aligned
(r-th choice with r-th choice), not the k x k combinations ``transitions.transition_matrix``
counts on our traces (both give k/N under uniform routing). ``olmoe`` lacks the c4 token file and
has ``olmoe_expert_counts_tulu``; SFT/DPO have only expert counts on tulu. A model gets the
statistics its files allow.

1. Sem-MoE §3.2 / Table 1 and A.2, per layer, pooled over domains (same (token, expert) counts
   summed) and per domain: activation map int64[n_tokens, N] -> ``token_stats`` cum hotness of the
   static top-k, max hotness of the non-top-k, Pearson kurtosis, over token ids with at least
   ``min_occurrences`` occurrences (row sum / k). F1 needs per-occurrence sets: ``"f1": None``. In
   sample, the mean F1 of a token's static top-k S over its own n occurrences is
   sum_t |S ∩ A_t| / (n k) = sum_{e in S} c_e / (n k), exactly its cum hotness of top-k, and no
   static set does better: ``f1_in_sample_bound`` = its quantiles over token ids,
   ``f1_in_sample_mean`` its occurrence-weighted mean (cf. A.2's 78.8% F1); out of sample F1 is
   lower. ``uniform``: the same p50s under uniform random routing with the same occurrence counts
   (seeded simulation, at most ``uniform_sample`` tokens): few occurrences inflate cum hotness.
2. Domain shift (Sem-MoE A.1): per layer the Jensen-Shannon distance (base 2, in [0, 1]) between
   the domains' expert distributions, its off-diagonal mean, the load imbalance max / mean of the
   pooled counts (``_top1`` too). SFT/DPO get ``js_vs_base``: distance from base OLMoE on tulu.
3. Inter-layer affinity (ExFlow §III-B eq. 1, Sem-MoE A.2): pooled pair counts int64[N, N] ->
   P(E_b | E_a) row-normalised, traffic-weighted ``transitions.topk_mass`` (k = top_k; k = 1 on
   ``_top1_`` pairs) beside uniform k/N and the independence baseline (every row = the layer-b
   marginal, above k/N when load is imbalanced).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy.spatial.distance import jensenshannon

from sempar.affinity.token_stats import LayerTable1, hotness_stats, pearson_kurtosis, quantiles
from sempar.affinity.transitions import topk_mass
from sempar.errors import InputError


class ModelSpec(NamedTuple):
    key: str                    # key in the result ("mixtral")
    prefix: str                 # file-name prefix ("mistral")
    model: str
    num_experts: int
    top_k: int
    base: str | None = None     # base model key, for js_vs_base


MODELS = (ModelSpec("olmoe", "olmoe", "OLMoE-1B-7B-0924", 64, 8),
          ModelSpec("mixtral", "mistral", "Mixtral-8x7B-v0.1", 8, 2),
          ModelSpec("olmoe-sft", "olmoe-sft", "OLMoE-1B-7B-0924-SFT", 64, 8, base="olmoe"),
          ModelSpec("olmoe-dpo", "olmoe-dpo", "OLMoE-1B-7B-0924-Instruct (DPO)", 64, 8,
                    base="olmoe"))
KINDS = ("token_expert_counts", "expert_counts_crosslayer_top1", "expert_counts_crosslayer",
         "expert_counts_top1", "expert_counts")
FILE_RE = re.compile(rf"^(?P<prefix>[^_]+)_(?P<kind>{'|'.join(KINDS)})_(?P<domain>[^_]+)\.npz$")
PAIRS_RE = re.compile(r"^layers(\d+)_(\d+)_pairs$")
TABLE1_KEYS = ("layer", "f1", "f1_in_sample_bound", "f1_in_sample_mean", "cum_hotness_topk",
               "max_hotness_non_topk", "kurtosis_p50", "tokens", "token_ids", "occurrences")


def _load(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from None


def _get(arrays: dict, key: str, path: Path, ndim: int, hi: int | None = None) -> np.ndarray:
    """arrays[key] as int64, checked: `ndim`-D integers, all in [0, hi) (hi None: >= 0)."""
    if key not in arrays:
        raise InputError(f"{path}: no array '{key}' (has {sorted(arrays)})")
    a = arrays[key]
    if a.ndim != ndim or not np.issubdtype(a.dtype, np.integer):
        raise InputError(f"{path}: array '{key}' is {a.dtype}{list(a.shape)}, expected "
                         f"{ndim}-D integers")
    bad = (a < 0) if hi is None else (a < 0) | (a >= hi)
    if bad.any():
        where = "is negative" if hi is None else f"is out of range [0, {hi})"
        raise InputError(f"{path}: array '{key}': value {a[bad][0]} {where}")
    return a.astype(np.int64)


def _layer_ids(files: dict[str, tuple[Path, dict]], pattern: str, example: str) -> list[int]:
    """Sorted ids (group 1 of `pattern`) in the array names of `files` {domain: (path, arrays)}."""
    ids = sorted({int(m.group(1)) for _, arr in files.values() for k in arr
                  if (m := re.fullmatch(pattern, k))})
    if files and not ids:
        path, arr = next(iter(files.values()))
        raise InputError(f"{path}: no array named like '{example}' (has {sorted(arr)})")
    return ids


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _js(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon distance, base 2 (rounding can turn identical inputs into NaN: 0)."""
    return float(np.nan_to_num(jensenshannon(p, q, base=2)))


# -- 1. token -> expert concentration (Sem-MoE §3.2, Table 1, A.2) ------------------------------

def activation_map(token_id: np.ndarray, expert: np.ndarray, count: np.ndarray,
                   num_experts: int) -> np.ndarray:
    """int64[n_tokens, N] summed counts per (token, expert); rows = the sorted distinct token ids.

    token_id, expert, count: int[n] parallel arrays (repeated (token, expert) pairs are summed).
    """
    uniq, inv = np.unique(token_id, return_inverse=True)
    dense = np.bincount(inv * num_experts + expert, weights=count,
                        minlength=uniq.size * num_experts)
    return np.rint(dense).astype(np.int64).reshape(uniq.size, num_experts)


def table1_from_counts(counts: np.ndarray, k: int, layer: int, min_occurrences: int = 2) -> dict:
    """Table-1 row of one layer from an activation map int[n_tokens, N] (see module docstring)."""
    sub = counts[counts.sum(axis=1) >= min_occurrences * k]
    cum, mx = hotness_stats(sub, k)
    row = LayerTable1(f1=np.empty(0), cum_hotness_topk=cum, max_hotness_non_topk=mx,
                      kurtosis=pearson_kurtosis(sub)).summary(layer)
    row.update(f1=None, f1_in_sample_bound=quantiles(cum),
               f1_in_sample_mean=float(np.average(cum, weights=sub.sum(1))) if cum.size else None,
               token_ids=int(counts.shape[0]), occurrences=int(counts.sum() // k))
    return {key: row[key] for key in TABLE1_KEYS}


def uniform_baseline(occurrences: np.ndarray, num_experts: int, k: int, sample: int,
                     seed: int = 0) -> dict:
    """Table-1 p50s when each occurrence picks a uniform random k-subset of the N experts.

    occurrences: int[n_tokens] occurrences per token; at most `sample` tokens are drawn (seeded).
    """
    rng = np.random.default_rng(seed)
    occ = (occurrences if occurrences.size <= sample
           else rng.choice(occurrences, sample, replace=False))
    rows = np.repeat(np.arange(occ.size), occ)
    counts = np.zeros(occ.size * num_experts, np.int64)
    for lo in range(0, rows.size, 1 << 16):                      # bounded memory
        r = rows[lo:lo + (1 << 16)]
        pick = np.argpartition(rng.random((r.size, num_experts)), k - 1, axis=1)[:, :k]
        counts += np.bincount((r[:, None] * num_experts + pick).ravel(), minlength=counts.size)
    t = table1_from_counts(counts.reshape(occ.size, num_experts), k, -1, min_occurrences=1)
    return {"cum_hotness_topk_p50": t["cum_hotness_topk"]["p50"], "tokens_sampled": int(occ.size),
            "max_hotness_non_topk_p50": t["max_hotness_non_topk"]["p50"],
            "kurtosis_p50": t["kurtosis_p50"]}


def _token_part(spec: ModelSpec, files: dict, min_occ: int, sample: int, out: dict) -> None:
    N, k = spec.num_experts, spec.top_k
    out["per_domain"] = {d: {"layers": []} for d in files}
    for layer in _layer_ids(files, r"layer(\d+)_token_id", "layer0_token_id"):
        trip = {}
        for d, (p, arr) in files.items():
            tid, exp, cnt = (_get(arr, f"layer{layer}_{n}", p, 1, hi)
                             for n, hi in (("token_id", None), ("expert", N), ("count", None)))
            if not tid.size == exp.size == cnt.size:
                raise InputError(f"{p}: layer{layer}_token_id/_expert/_count have different "
                                 f"lengths ({tid.size}, {exp.size}, {cnt.size})")
            trip[d] = (tid, exp, cnt)
            out["per_domain"][d]["layers"].append(
                table1_from_counts(activation_map(tid, exp, cnt, N), k, layer, min_occ))
        pooled = activation_map(*(np.concatenate(a) for a in zip(*trip.values())), N)
        row, rs = table1_from_counts(pooled, k, layer, min_occ), pooled.sum(axis=1)
        row["uniform"] = uniform_baseline(rs[rs >= min_occ * k] // k, N, k, sample, seed=layer)
        out["_rows"].setdefault(layer, {"layer": layer}).update(row)


# -- 2. domain shift of expert preferences (Sem-MoE A.1) -----------------------------------------

def _expert_dists(spec: ModelSpec, files: dict) -> dict[int, dict[str, np.ndarray]]:
    """{layer: {domain: int64[N] selections per expert}}."""
    out: dict[int, dict[str, np.ndarray]] = {}
    for layer in _layer_ids(files, r"layer(\d+)", "layer0"):
        for d, (p, arr) in files.items():
            c = _get(arr, f"layer{layer}", p, 1)
            if c.size != spec.num_experts or c.sum() == 0:
                raise InputError(f"{p}: array 'layer{layer}' has {c.size} experts and {c.sum()} "
                                 f"selections, expected {spec.num_experts} experts, not all zero")
            out.setdefault(layer, {})[d] = c
    return out


def _domain_part(spec: ModelSpec, files: dict, top1: dict, out: dict) -> None:
    out["_dists"] = dists = _expert_dists(spec, files)
    for layer, per in dists.items():
        P = [c / c.sum() for c in per.values()]
        js = np.array([[_js(p, q) if i != j else 0.0 for j, q in enumerate(P)]
                       for i, p in enumerate(P)])
        off = js[~np.eye(len(P), dtype=bool)]
        out["domain_js"][str(layer)], out["domain_js_domains"] = np.round(js, 5).tolist(), list(per)
        pooled = sum(per.values())
        out["_rows"].setdefault(layer, {"layer": layer}).update(
            domain_js_mean=float(off.mean()) if off.size else None,
            load_imbalance_max_mean=float(pooled.max() / pooled.mean()))
    for layer, per in _expert_dists(spec, top1).items():
        pooled = sum(per.values())
        out["_rows"].setdefault(layer, {"layer": layer})["load_imbalance_top1_max_mean"] = \
            float(pooled.max() / pooled.mean())


def _js_vs_base(models: dict) -> None:
    for spec in MODELS:
        m, base = models.get(spec.key), models.get(spec.base or "")
        if m and base and "_dists" in m and "_dists" in base:
            m["js_vs_base"] = {"base": spec.base, "layers": [
                {"layer": layer, "domain": d, "js": _js(c, base["_dists"][layer][d])}
                for layer, per in m["_dists"].items() for d, c in per.items()
                if d in base["_dists"].get(layer, {})]}


# -- 3. inter-layer affinity (ExFlow §III-B, Sem-MoE A.2) ---------------------------------------

def _pair_counts(spec: ModelSpec, files: dict) -> dict[tuple[int, int], np.ndarray]:
    """{(a, b): int64[N, N] rank-aligned pair counts pooled over domains}."""
    N = spec.num_experts
    out: dict[tuple[int, int], np.ndarray] = {}
    _layer_ids(files, r"layers(\d+)_\d+_pairs", "layers0_7_pairs")
    for p, arr in files.values():
        for key in arr:
            if m := PAIRS_RE.fullmatch(key):
                a = _get(arr, key, p, 2)
                if a.shape[1] != 3 or a[:, :2].max(initial=0) >= N:
                    raise InputError(f"{p}: array '{key}' is {list(a.shape)}, expected [rows, 3] "
                                     f"rows (expert < {N}, expert < {N}, count)")
                c = np.bincount(a[:, 0] * N + a[:, 1], weights=a[:, 2], minlength=N * N)
                pair = (int(m.group(1)), int(m.group(2)))
                out[pair] = out.get(pair, 0) + np.rint(c).astype(np.int64).reshape(N, N)
    return out


def _crosslayer_part(spec: ModelSpec, files: dict, top1: dict, out: dict) -> None:
    N, k = spec.num_experts, spec.top_k
    full, one = _pair_counts(spec, files), _pair_counts(spec, top1)
    for pair in sorted(set(full) | set(one)):
        e: dict = {"from": pair[0], "to": pair[1], "uniform": k / N, "uniform_top1": 1 / N}
        if (c := full.get(pair)) is not None:
            tot = c.sum(axis=1, keepdims=True)
            e.update(topk_mass=topk_mass(c, k), topk_mass_independent=topk_mass(c.sum(0)[None], k),
                     pairs=int(c.sum()), matrix=np.round(c / np.maximum(tot, 1), 5).tolist())
        if (c := one.get(pair)) is not None:
            e.update(top1_mass=topk_mass(c, 1), top1_mass_independent=topk_mass(c.sum(0)[None], 1))
        out["crosslayer"].append(e)


# -- driver ---------------------------------------------------------------------------------------

def analyze_aggregates(folder: str | Path, min_occurrences: int = 2,
                       uniform_sample: int = 1000) -> dict:
    """Sempar's Table-1, domain-shift and inter-layer statistics of every model in `folder`.

    Returns a JSON-serialisable {"source", "min_occurrences", "models": {key: {"model",
    "num_experts", "top_k", "domains", "domains_by_kind", "layer_ids", "layers": [{"layer", ...}],
    "per_domain", "domain_js", "domain_js_domains", "crosslayer", "js_vs_base", "summary"}}}, keys
    present only where the files allow. InputError for a missing folder, a folder with no
    recognised file, an unreadable npz or one lacking (or with a malformed) expected array.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: " + ("is a file, not a folder of routing aggregates"
                                          if folder.exists() else "no such folder"))
    by_prefix, idx = {s.prefix: s.key for s in MODELS}, {}
    for p in sorted(folder.iterdir()):
        if (m := FILE_RE.match(p.name)) and p.is_file() and m["prefix"] in by_prefix:
            idx.setdefault(by_prefix[m["prefix"]], {}).setdefault(m["kind"], {})[m["domain"]] = p
    if not idx:
        raise InputError(f"{folder}: no routing-aggregate files (expected "
                         f"<model>_<kind>_<domain>.npz, model in {[s.prefix for s in MODELS]}, "
                         f"kind in {list(KINDS)})")
    models: dict[str, dict] = {}
    for spec in (s for s in MODELS if s.key in idx):
        f = {kind: {d: (p, _load(p)) for d, p in doms.items()}
             for kind, doms in idx[spec.key].items()}
        out: dict = {"model": spec.model, "num_experts": spec.num_experts, "top_k": spec.top_k,
                     "domains": sorted({d for doms in f.values() for d in doms}),
                     "domains_by_kind": {kind: sorted(doms) for kind, doms in f.items()},
                     "_rows": {}}
        if "token_expert_counts" in f:
            _token_part(spec, f["token_expert_counts"], min_occurrences, uniform_sample, out)
        if "expert_counts" in f or "expert_counts_top1" in f:
            out["domain_js"] = {}
            _domain_part(spec, f.get("expert_counts", {}), f.get("expert_counts_top1", {}), out)
        if "expert_counts_crosslayer" in f or "expert_counts_crosslayer_top1" in f:
            out["crosslayer"] = []
            _crosslayer_part(spec, f.get("expert_counts_crosslayer", {}),
                             f.get("expert_counts_crosslayer_top1", {}), out)
        rows = out.pop("_rows")
        out["layer_ids"], out["layers"] = sorted(rows), [rows[layer] for layer in sorted(rows)]
        models[spec.key] = out
    _js_vs_base(models)
    for out in models.values():
        out.pop("_dists", None)
        out["summary"] = _summary(out)
    return {"source": str(folder), "min_occurrences": min_occurrences, "models": models}


def _summary(out: dict) -> dict:
    rows, cross = out["layers"], out.get("crosslayer", [])
    def p50(key: str) -> float | None:
        return _mean((r.get(key) or {}).get("p50") for r in rows)

    s = {"cum_hotness_topk_p50_mean": p50("cum_hotness_topk"),
         "max_hotness_non_topk_p50_mean": p50("max_hotness_non_topk"),
         "kurtosis_p50_mean": _mean(r.get("kurtosis_p50") for r in rows),
         "domain_js_mean": _mean(r.get("domain_js_mean") for r in rows),
         "load_imbalance_max_mean_mean": _mean(r.get("load_imbalance_max_mean") for r in rows),
         "crosslayer_topk_mass_mean": _mean(e.get("topk_mass") for e in cross),
         "crosslayer_top1_mass_mean": _mean(e.get("top1_mass") for e in cross)}
    return {k: v for k, v in s.items() if v is not None}
