"""How the plan's answer moves if compute were slower or faster than the forecast prices it
(`Accelerator.compute_scale`): the report's sensitivity line.

For each scale (1.3: every compute time 30 % longer; 0.7: 30 % shorter) the recommended
deployment and SGLang's launch are prepared again on forecasters whose accelerator carries that
scale (placements, homes and routing shared: they do not depend on compute), the SLOs re-derived
from the scaled baseline's lightest load unless given (as the plan derives them), and both
figures searched on the rate as the plan does; the line reports the recommended deployment's
gain over the launch at each scale beside the nominal one.
"""

from __future__ import annotations

import copy
from dataclasses import replace

SCALES = (1.3, 0.7)


def scaled(fc, scale: float):
    """A shallow copy of Forecaster `fc` whose compute times are x `scale` (caches shared)."""
    out = copy.copy(fc)
    out.acc = replace(fc.acc, compute_scale=fc.acc.compute_scale * scale)
    return out


def compute_sensitivity(lead_fc, lead_v, base_fc, base_v, served, light_slos, forecast,
                        scales=SCALES, progress=None) -> list[dict]:
    """[{scale, text, throughput_under_slo, baseline_throughput_under_slo, gain}] per scale.

    light_slos(fc, p) -> the SLOs from baseline deployment p's lightest load on fc;
    forecast(fc, p, slos) -> the plan's figures of deployment p (throughput_under_slo, ...)."""
    out = []
    for s in scales:
        if progress:
            progress(f"sensitivity: compute x {s:g}")
        fb = scaled(base_fc, s)
        fl = fb if lead_fc is base_fc else scaled(lead_fc, s)
        pb = fb.prepare(base_v, served=served)
        pl = fl.prepare(lead_v, served=served)
        slos = light_slos(fb, pb)
        b = forecast(fb, pb, slos)["throughput_under_slo"]
        t = forecast(fl, pl, slos)["throughput_under_slo"]
        out.append({"scale": s, "text": f"compute {abs(s - 1):.0%} {'slower' if s > 1 else 'faster'}",
                    "throughput_under_slo": t, "baseline_throughput_under_slo": b,
                    "gain": t / b if t and b else None})
    return out


def sensitivity_text(res: dict) -> str:
    """One sentence of a plan result's sensitivity (empty without one)."""
    sens = res.get("sensitivity") or []
    if not sens or not res.get("ranked"):
        return ""
    win, base = res["ranked"][0], res["baseline"]
    nominal = (win["throughput_under_slo"] / base["throughput_under_slo"]
               if win["throughput_under_slo"] and base["throughput_under_slo"] else None)
    parts = [f"{x['text']}: {x['gain']:.2f}x" if x["gain"] else f"{x['text']}: n/a" for x in sens]
    nom = f"{nominal:.2f}x" if nominal else "n/a"
    return (f"Sensitivity: the recommended deployment's gain over SGLang's launch is {nom} as "
            f"forecast; if {', if '.join(parts)} (SLOs re-derived at each).")
