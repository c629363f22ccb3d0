"""The forecast's compute model corrected by an accelerator profile (accel_profile.py).

Each block (roof_parts.py) costs

    t = F_op + roofline(work) x s(tokens[, context])

F_op the profile's fixed cost of the op (`fixed_us`, the fixed per-kernel cost model), and
s the measured efficiency factor: at each measured point s_i = (measured_i - F_op) /
roofline_i, so the forecast reproduces every measured point; between points s is
piecewise-linear in log(tokens) (attention: bilinear in log(tokens) and log(context), per
phase), and beyond the measured range it is held at the end value. Interpolating s rather than
the time keeps what the roofline knows (the expert weights read per active expert, the KV bytes
of each context) and the fixed cost out of the interpolation; on held-out points of the shipped
measurements it is within the error `sempar calibrate check --holdout` prints (docs/calibrate.md).

Which curve prices a block: the profile's entries of the same shape (moe_block: hidden, expert
and shared sizes, experts, top-k, and the nearest experts-per-rank in log; attention: hidden,
heads, KV heads, head dim, MLA ranks; lm_head: hidden, vocab; dense_mlp: hidden, intermediate).
A block with no curve costs F_op + roofline (s = 1); an accelerator with no profile takes F_op
from the shipped H100 profile (GPUs only: `Accelerator.launch_floor`).

Mixed iterations: an instance's attention with both prefill and decode tokens takes the
token-weighted mean of the two phases' s at its mean context (attn_ctx / tokens).
"""

from __future__ import annotations

import math

import numpy as np

from sempar.serving.accel_profile import (FLOOR_FROM, AcceleratorProfile, Entry, point_roof,
                                          profile_of, shipped_profile)
from sempar.serving.dims import ModelDims
from sempar.serving.hardware import Accelerator
from sempar.serving.roof_parts import RoofParts


class Curve:
    """s over log tokens, one segment list per context (contexts increasing; one for ops
    without a context)."""

    def __init__(self, contexts: list[float], tokens: list[np.ndarray], s: list[np.ndarray]):
        self.logc = np.log(np.asarray(contexts, np.float64))
        self.logt = [np.log(t.astype(np.float64)) for t in tokens]
        self.s = s

    def __call__(self, tokens, context=None) -> np.ndarray:
        lt = np.log(np.maximum(np.asarray(tokens, np.float64), 1.0))
        vals = [np.interp(lt, x, y) for x, y in zip(self.logt, self.s)]
        if len(vals) == 1 or context is None:
            return vals[0]
        v = np.stack(vals)                                   # [J, ...]
        lc = np.log(np.maximum(np.asarray(context, np.float64), 1.0)) + np.zeros_like(lt)
        j = np.clip(np.searchsorted(self.logc, lc) - 1, 0, len(vals) - 2)
        w = np.clip((lc - self.logc[j]) / (self.logc[j + 1] - self.logc[j]), 0.0, 1.0)
        v0 = np.take_along_axis(v, j[None], 0)[0]
        v1 = np.take_along_axis(v, (j + 1)[None], 0)[0]
        return v0 + w * (v1 - v0)


def _efficiency(entries: list[Entry], acc: Accelerator, fixed_s: float) -> Curve:
    entries = list({e.context: e for e in sorted(entries, key=lambda e: -e.context)}.values())
    entries.sort(key=lambda e: e.context)
    s = []
    for e in entries:
        parts = RoofParts(e.dims, acc)
        r = np.array([point_roof(parts, e, float(t)) for t in e.tokens])
        s.append(np.maximum((e.measured_us * 1e-6 - fixed_s) / np.maximum(r, 1e-15), 0.05))
    return Curve([max(1, e.context) for e in entries], [e.tokens for e in entries], s)


def _key(op: str, d: ModelDims) -> tuple:
    if op == "moe_block":
        return (d.hidden, d.moe_intermediate, d.num_experts, d.top_k, d.shared_params)
    if op == "attention":
        return (d.hidden, d.heads, d.kv_heads, d.head_dim, d.mla)
    if op == "lm_head":
        return (d.hidden, d.vocab)
    return (d.hidden, d.dense_intermediate)


class Calibration:
    """Fixed costs (seconds) and efficiency curves of one model on one accelerator with G EP
    ranks (each holding ceil(N / G) experts): `fixed[op]`, `curve(op[, phase])` or None."""

    def __init__(self, dims: ModelDims, acc: Accelerator, G: int,
                 profile: AcceleratorProfile | None = None, use_shipped: bool = True):
        prof = profile if profile is not None else (profile_of(acc) if use_shipped else None)
        self.profile = prof
        floor = prof if prof is not None else (shipped_profile(FLOOR_FROM) if acc.launch_floor
                                               and use_shipped else None)
        self.fixed = {op: (floor.fixed_us[op] * 1e-6 if floor else 0.0)
                      for op in ("moe_block", "attention", "lm_head", "dense_mlp")}
        self.curves: dict = {}
        if prof is None:
            return
        E = math.ceil(dims.num_experts / max(1, G))
        for op in ("moe_block", "lm_head", "dense_mlp"):
            match = [e for e in prof.entries if e.op == op and _key(op, e.dims) == _key(op, dims)]
            if op == "moe_block" and match:
                best = min({e.experts_per_rank for e in match},
                           key=lambda x: (abs(math.log(x / E)), -x))
                match = [e for e in match if e.experts_per_rank == best]
            if match:
                self.curves[op] = _efficiency(match[:1], acc, self.fixed[op])
        for phase in ("decode", "prefill"):
            match = [e for e in prof.entries if e.op == "attention" and e.phase == phase
                     and _key("attention", e.dims) == _key("attention", dims)]
            if match:
                self.curves[("attention", phase)] = _efficiency(match, acc, self.fixed["attention"])

    def s(self, op, tokens, context=None):
        """Efficiency factor of `op` (or ("attention", phase)) at `tokens` (1.0 without a curve)."""
        c = self.curves.get(op)
        return 1.0 if c is None else c(tokens, context)

    def attention_s(self, prefill, decode, ctx_mean):
        dec = self.curves.get(("attention", "decode"))
        pre = self.curves.get(("attention", "prefill"))
        if dec is None and pre is None:
            return 1.0
        dec, pre = dec or pre, pre or dec
        n = np.maximum(prefill + decode, 1e-12)
        return (prefill * pre(prefill, ctx_mean) + decode * dec(decode, ctx_mean)) / n
