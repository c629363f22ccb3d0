"""The forecast against measurements (`sempar calibrate check`), and profiles from measurement
lines (`sempar calibrate convert`, and `--holdout`'s leave-one-out profiles).

Every line is priced by the forecast's own block functions (serving/roofline.Roofline:
`attention_seconds`, `router_shared_seconds` + `expert_device_seconds`, `head_seconds`,
`dense_mlp_seconds`), on the line's model and EP size, so the figure checked is the one
`serve-sim` and `plan` use. Error = |predicted / measured - 1|.

`--holdout`: for each line, a profile converted from every other line of the files (fixed costs
refitted) prices it: the interpolation's error on a shape the profile did not include.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from sempar.serving.accel_profile import AcceleratorProfile, build_profile
from sempar.serving.hardware import Accelerator
from sempar.serving.roof_parts import RoofParts
from sempar.serving.roofline import Roofline


def predict_us(point: dict, acc: Accelerator) -> float:
    """The forecast's microseconds for one measured point on `acc` (its profile attached)."""
    d, t = point["dims"], float(point["tokens"])
    if point["op"] == "moe_block":
        E = point["experts_per_rank"]
        roof = Roofline(d, acc, max(1, math.ceil(d.num_experts / E)), tp=False)
        n = max(1, int(t) // d.top_k)
        s = roof.router_shared_seconds(n) + roof.expert_device_seconds(t, min(E, t))
    else:
        roof = Roofline(d, acc, 1, tp=False)
        if point["op"] == "attention":
            C = float(point["context"])
            s = (roof.attention_seconds(0.0, t, t * C, t * C) if point["phase"] == "decode"
                 else roof.attention_seconds(t, 0.0, t * C, C))
        elif point["op"] == "lm_head":
            s = roof.head_seconds(t)
        else:
            s = roof.dense_mlp_seconds(t)
    return float(s) * 1e6


def plain_roof_us(point: dict, acc: Accelerator) -> float:
    from sempar.serving.accel_profile import Entry, point_roof

    e = Entry(point["op"], point["model"], point["dims"], np.array([point["tokens"]]),
              np.array([1.0]), point.get("experts_per_rank", 0), point.get("phase", ""),
              point.get("context", 0))
    return point_roof(RoofParts(point["dims"], acc), e, float(point["tokens"])) * 1e6


def summary(errors: list[float]) -> dict:
    a = np.abs(np.asarray(errors, np.float64))
    if not a.size:
        return {"median_abs_error": None, "max_abs_error": None, "p90_abs_error": None,
                "within_0_20": None}
    return {"median_abs_error": float(np.median(a)), "max_abs_error": float(a.max()),
            "p90_abs_error": float(np.quantile(a, 0.9)), "within_0_20": float((a <= 0.20).mean())}


def check(lines: list[tuple[dict, dict]], acc: Accelerator, holdout_from: str | None = None,
          source: dict | None = None) -> dict:
    """Per line the forecast beside the measurement. `holdout_from` = the accelerator name the
    leave-one-out profiles are built for (None: price with `acc` as given)."""
    out, errs = [], []
    for i, (line, point) in enumerate(lines):
        a = acc
        if holdout_from is not None:
            rest = [p for j, (_, p) in enumerate(lines) if j != i]
            a = replace(acc, profile=build_profile(holdout_from, source or {}, rest))
        pred = predict_us(point, a)
        m = float(point["measured_us"])
        err = pred / m - 1
        errs.append(err)
        out.append({**{k: v for k, v in line.items() if k not in ("dims",)},
                    "op": point["op"], "predicted_us": round(pred, 2), "measured_us": m,
                    "roofline_us": round(plain_roof_us(point, acc), 2), "error": round(err, 4)})
    return {"lines": out, **summary(errs)}


def convert(lines: list[tuple[dict, dict]], accelerator: str, source: dict) -> AcceleratorProfile:
    """A profile of the measured points (build_profile groups them into curves)."""
    return build_profile(accelerator, source, [p for _, p in lines])
