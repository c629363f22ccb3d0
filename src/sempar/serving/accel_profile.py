"""Accelerator profiles: measured times of the operator blocks the serving forecast prices.

A profile is one JSON object (schema `sempar.accelerator-profile`, version 1; docs/calibrate.md):

    {"schema": "sempar.accelerator-profile", "version": 1,
     "accelerator": "h100",              # the registered accelerator whose roofline it corrects
     "source": {"kind": "measured" | "converted", "device": "NVIDIA H100 80GB HBM3",
                "date": "2026-11-27", "torch": "...", "from": "...", "command": "..."},
     "fixed_us": {"moe_block": 62.0, "attention": 30.4, "lm_head": 0.0, "dense_mlp": 15.5},
     "entries": [{"op": "moe_block", "model": "gpt-oss-20b", "dims": {ModelDims fields},
                  "experts_per_rank": 4, "tokens": [8, 64, ...], "measured_us": [...]},
                 {"op": "attention", ..., "phase": "decode", "context": 1024, "tokens": [...]},
                 {"op": "lm_head" | "dense_mlp", ..., "tokens": [...], "measured_us": [...]}]}

Ops (roof_parts.py prices the same blocks): `moe_block` = router + top-k + shared experts +
the routed experts of one EP rank, `tokens` = token-expert copies the rank serves (spread evenly
over its `experts_per_rank` experts); `attention` = projections + core, `tokens` = decode
requests (each of `context` cached tokens) or one prefill chunk (attending to `context`);
`lm_head` and `dense_mlp`, `tokens` = tokens through them. Times are medians of CUDA-graph
replays in microseconds.

`fixed_us` is the model of the fixed per-kernel cost: per op, the median over its entries of
what the smallest measured point exceeds the plain roofline by (clipped to [0, 0.9 x the op's
smallest time]); an op with no entries gets its kernel count (`KERNELS`) x the per-kernel cost
of the ops that have entries. Accelerators without a profile price every block as roofline +
the shipped H100 profile's `fixed_us` (calibration.py).

The shipped profiles are `src/sempar/assets/accelerators/<accelerator>.json` (`shipped_profile`);
replacing that file (e.g. by one `sempar calibrate` measured) is all it takes to change them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from sempar.errors import InputError
from sempar.serving.dims import ModelDims, check_dims
from sempar.serving.hardware import ACCELERATORS, Accelerator
from sempar.serving.roof_parts import RoofParts

SCHEMA, VERSION = "sempar.accelerator-profile", 1
KERNELS = {"moe_block": 8, "attention": 8, "lm_head": 1, "dense_mlp": 4}  # kernels per block
PHASES = ("decode", "prefill")
ASSET_DIR = Path(__file__).resolve().parents[1] / "assets" / "accelerators"
FLOOR_FROM = "h100"     # the profile whose fixed costs unprofiled GPUs get


@dataclass(frozen=True)
class Entry:
    """One measured curve: `op` of `dims` over tokens (int64[P], increasing), measured_us
    (float64[P]); moe_block: experts_per_rank; attention: phase and context."""

    op: str
    model: str
    dims: ModelDims
    tokens: np.ndarray
    measured_us: np.ndarray
    experts_per_rank: int = 0
    phase: str = ""
    context: int = 0

    def roof_us(self, acc: Accelerator, tokens=None) -> np.ndarray:
        """The plain roofline of this entry's points (or of `tokens`), microseconds."""
        parts = RoofParts(self.dims, acc)
        ts = self.tokens if tokens is None else np.atleast_1d(tokens)
        return np.array([point_roof(parts, self, float(t)) * 1e6 for t in ts])

    def to_json(self) -> dict:
        out = {"op": self.op, "model": self.model, "dims": asdict(self.dims)}
        if self.op == "moe_block":
            out["experts_per_rank"] = self.experts_per_rank
        if self.op == "attention":
            out.update(phase=self.phase, context=self.context)
        return {**out, "tokens": [int(t) for t in self.tokens],
                "measured_us": [round(float(m), 3) for m in self.measured_us]}


def point_roof(parts: RoofParts, e: Entry, tokens: float) -> float:
    """Roofline seconds of one measured point of entry `e` (the measured shape)."""
    if e.op == "moe_block":
        return parts.moe_block_point(tokens, e.experts_per_rank)
    if e.op == "attention":
        return parts.attention_point(e.phase, tokens, e.context)
    if e.op == "lm_head":
        return float(parts.head(tokens))
    return float(parts.dense_mlp(tokens))


@dataclass(frozen=True)
class AcceleratorProfile:
    accelerator: str
    source: dict
    fixed_us: dict
    entries: tuple = ()
    path: str = field(default="", compare=False)

    def describe(self) -> str:
        """Where the profile came from, in one line (the reports quote it)."""
        s = self.source
        dev, date = s.get("device", "an unnamed device"), s.get("date", "an unknown date")
        where = f" ({self.path})" if self.path else ""
        if s.get("kind") == "measured":
            return f"{self.accelerator} profile measured on {dev} on {date} by sempar calibrate{where}"
        return (f"{self.accelerator} profile converted from {s.get('from', 'measurements')} "
                f"(measured on {dev} on {date}){where}")

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, "accelerator": self.accelerator,
                "source": self.source, "fixed_us": {k: round(v, 3) for k, v in self.fixed_us.items()},
                "entries": [e.to_json() for e in self.entries]}


# ---- building -------------------------------------------------------------------------------
def fit_fixed(entries, acc: Accelerator) -> dict:
    """fixed_us per op (module docstring): the median excess over the roofline at each entry's
    smallest point; ops without entries get KERNELS x the per-kernel cost of the others."""
    excess: dict = {}
    smallest: dict = {}
    for e in entries:
        d = float(e.measured_us[0] - e.roof_us(acc, e.tokens[:1])[0])
        excess.setdefault(e.op, []).append(d)
        smallest[e.op] = min(smallest.get(e.op, math.inf), float(e.measured_us.min()))
    out = {op: float(np.clip(np.median(v), 0.0, 0.9 * smallest[op])) for op, v in excess.items()}
    per_kernel = float(np.median([out[op] / KERNELS[op] for op in out])) if out else 0.0
    for op in KERNELS:
        out.setdefault(op, KERNELS[op] * per_kernel)
    return out


def build_profile(accelerator: str, source: dict, points: list[dict]) -> AcceleratorProfile:
    """A profile from measured points, each {op, model, dims (ModelDims), tokens, measured_us,
    experts_per_rank | phase, context}; points of one curve are grouped into one entry."""
    acc = ACCELERATORS.get(accelerator)
    groups: dict = {}
    for p in points:
        key = (p["op"], p["model"], p["dims"], p.get("experts_per_rank", 0), p.get("phase", ""),
               p.get("context", 0))
        groups.setdefault(key, {})[int(p["tokens"])] = float(p["measured_us"])
    entries = []
    for (op, model, dims, E, phase, ctx), pts in groups.items():
        t = np.array(sorted(pts), np.int64)
        entries.append(Entry(op, model, dims, t, np.array([pts[x] for x in t.tolist()]),
                             E, phase, ctx))
    return AcceleratorProfile(accelerator, source, fit_fixed(entries, acc), tuple(entries))


# ---- reading --------------------------------------------------------------------------------
def _bad(path, what: str) -> InputError:
    return InputError(f"accelerator profile {path}: {what}")


def _entry(path, i: int, raw) -> Entry:
    if not isinstance(raw, dict):
        raise _bad(path, f"entries[{i}] is not an object")
    op = raw.get("op")
    if op not in KERNELS:
        raise _bad(path, f"entries[{i}].op {op!r} is not one of {', '.join(KERNELS)}")
    d = raw.get("dims")
    names = {f.name for f in fields(ModelDims)}
    if not isinstance(d, dict) or set(d) - names or not {"name", "hidden"} <= set(d):
        raise _bad(path, f"entries[{i}].dims is not a ModelDims object")
    try:
        mla = d.get("mla")
        dims = check_dims(ModelDims(**{**d, "mla": tuple(mla) if isinstance(mla, list) else mla}),
                          f"entries[{i}].dims")
    except TypeError:
        raise _bad(path, f"entries[{i}].dims has a field that is not a non-negative integer") from None
    except InputError as err:
        raise _bad(path, str(err)) from None
    t, m = raw.get("tokens"), raw.get("measured_us")
    ok = (isinstance(t, list) and isinstance(m, list) and 0 < len(t) == len(m) <= 10_000
          and all(isinstance(x, int) and 0 < x < 2 ** 40 for x in t)
          and all(isinstance(x, (int, float)) and math.isfinite(x) and 0 < x < 1e12 for x in m))
    if not ok or any(b <= a for a, b in zip(t, t[1:])):
        raise _bad(path, f"entries[{i}]: tokens must be increasing positive integers and "
                   f"measured_us as many positive finite numbers")
    E, phase, ctx = raw.get("experts_per_rank", 0), raw.get("phase", ""), raw.get("context", 0)
    if op == "moe_block" and not (isinstance(E, int) and 0 < E <= dims.num_experts):
        raise _bad(path, f"entries[{i}].experts_per_rank must be in 1..{dims.num_experts}")
    if op == "attention" and (phase not in PHASES or not isinstance(ctx, int) or not 0 < ctx < 2 ** 40):
        raise _bad(path, f"entries[{i}]: attention needs phase decode|prefill and a positive context")
    return Entry(op, str(raw.get("model", dims.name)), dims, np.array(t, np.int64),
                 np.array(m, np.float64), E, phase, ctx)


def profile_from_json(raw, path="<profile>") -> AcceleratorProfile:
    """Validate a parsed profile; InputError (one line) naming what is wrong."""
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise _bad(path, f"not a {SCHEMA} object")
    if raw.get("version") != VERSION:
        raise _bad(path, f"version {raw.get('version')!r}; this sempar reads version {VERSION}")
    acc = raw.get("accelerator")
    if acc not in ACCELERATORS:
        raise _bad(path, f"accelerator {acc!r} is not one of {', '.join(ACCELERATORS.names())}")
    src, fixed, ents = raw.get("source"), raw.get("fixed_us"), raw.get("entries")
    if not isinstance(src, dict) or not isinstance(ents, list) or not isinstance(fixed, dict):
        raise _bad(path, "needs a source object, a fixed_us object and an entries list")
    if set(fixed) != set(KERNELS) or not all(isinstance(v, (int, float)) and math.isfinite(v)
                                             and 0 <= v < 1e9 for v in fixed.values()):
        raise _bad(path, f"fixed_us must give {', '.join(KERNELS)} as non-negative numbers")
    source = {str(k): str(v)[:300] for k, v in src.items()}
    return AcceleratorProfile(acc, source, {k: float(v) for k, v in fixed.items()},
                              tuple(_entry(path, i, e) for i, e in enumerate(ents)), str(path))


def load_profile(path: str | Path) -> AcceleratorProfile:
    from sempar.safe_json import read_json_object

    return profile_from_json(read_json_object(path, "accelerator profile"), path)


@functools.cache
def shipped_profile(accelerator: str) -> AcceleratorProfile | None:
    """The profile shipped for `accelerator` (assets/accelerators/<name>.json), or None."""
    p = ASSET_DIR / f"{accelerator}.json"
    if not p.is_file():
        return None
    prof = load_profile(p)
    return AcceleratorProfile(prof.accelerator, prof.source, prof.fixed_us, prof.entries,
                              f"assets/accelerators/{p.name}")


def profile_of(acc: Accelerator) -> AcceleratorProfile | None:
    """The profile the forecast uses for `acc`: the one attached (--accelerator-profile), else
    the shipped one of its name."""
    return acc.profile if acc.profile is not None else shipped_profile(acc.name)


def compute_model(acc: Accelerator) -> str:
    """The forecast's compute model for `acc`, in one line (reports, --json)."""
    prof = profile_of(acc)
    if prof is not None:
        return f"measured operator profile: {prof.describe()}"
    floor = shipped_profile(FLOOR_FROM)
    if acc.launch_floor and floor is not None:
        return (f"no profile for {acc.name}: roofline + the fixed per-kernel cost fitted on the "
                f"{floor.describe()}")
    return f"roofline of {acc.name} (no profile, no fixed cost)"
