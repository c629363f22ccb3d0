"""The serving forecast as report sections (`sempar demo`): the answer first -- what to deploy,
what it buys against SGLang's launch under each SLO with its interval, what the gain is made of,
how sure the forecast is -- then the evidence per model and topology: every deployment beside
the baseline with the ratio to it, the commands and the latency-throughput curves."""

from __future__ import annotations

from pathlib import Path


CAVEATS = ("How sure: the forecast is a model, not a measurement. Compute is priced per operator "
           "block from the accelerator's measured profile (fixed cost + roofline x measured "
           "efficiency, serving/calibration.py; without a profile the roofline at 60% of peak "
           "FLOP/s and 80% of peak bandwidth plus a fixed per-kernel cost), communication is "
           "sempar.comm's alpha-beta model of the topology on the trace's real routing, and "
           "iterations draw their tokens at random from the held-out 80% of the trace. Gaps it "
           "cannot see: kernel launch and scheduler overheads, overlap of communication with "
           "compute, preemption. Rankings between systems are firmer than absolute figures.")


def slo_text(res: dict) -> str:
    """The SLOs of a `compare` result per attention mode, with the baseline that set them."""
    by_mode = res.get("slos_by_attention") or {"dp": res["slos"]}
    base = res.get("slo_baselines") or {"dp": res["baseline"]}
    given = set(res.get("slos_given") or ())
    return "; ".join(f"{m.upper()} ({res['slo_scale']:g}x {base[m]} at the lightest load"
                     + (", given: " + ", ".join(sorted(given)) if given else "") + "): "
                     + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in slos.items())
                     for m, slos in by_mode.items())


def _ratio_interval(r: dict, base: dict) -> tuple[float | None, float | None, float | None]:
    """(ratio, low, high) of throughputs under the SLO: the figures' ratio, and the ratio of
    the intervals' far ends (deployment's low / baseline's high, and the reverse)."""
    t, b = r["throughput_under_slo"], base["throughput_under_slo"]
    (lo, hi), (blo, bhi) = r["throughput_interval"], base["throughput_interval"]
    ratio = t / b if t and b else None
    low = lo / bhi if lo and bhi else None
    high = hi / blo if hi and blo else None
    return ratio, low, high


def gain_text(r: dict, base: dict) -> str:
    ratio, low, high = _ratio_interval(r, base)
    if ratio is None:
        return "n/a"
    return (f"{ratio:.2f}x [{'-' if low is None else f'{low:.2f}'}, "
            f"{'-' if high is None else f'{high:.2f}'}]")


def _made_of(res: dict) -> str:
    parts = res.get("attribution") or []
    if not parts:
        return "nothing: it is SGLang's own launch"
    return ", ".join(f"{p['part']} {p['gain']:.2f}x" for p in parts if p["gain"]) or "n/a"


def compared_text(res: dict) -> str:
    """What the plan compared: the screened candidates by part, how many were forecast in full,
    and what was skipped (and why, once per reason)."""
    from sempar.comm.pipelines import PIPELINES

    sc = res.get("screened") or []
    parts = {k: sorted({str(x[k]) for x in sc}) for k in ("pipeline", "placement", "redundant")}
    # request policies are Attention-DP's; a TP pipeline's placeholder policy is not one
    parts["policy"] = sorted({x["policy"] for x in sc
                              if x["pipeline"] not in PIPELINES or
                              PIPELINES.get(x["pipeline"]).attention == "dp"})
    skipped = res.get("skipped") or []
    why = sorted({x["reason"].split(": ", 1)[-1].strip()[:200] for x in skipped})
    return (f"compared {len(sc)} deployments (pipelines {', '.join(parts['pipeline'])}; "
            f"placements {', '.join(parts['placement'])}; Attention-DP policies "
            f"{', '.join(parts['policy'])}; "
            f"redundant slots {', '.join(parts['redundant'])}), {len(res['ranked'])} forecast "
            "in full" + (f"; {len(skipped)} skipped ({'; '.join(why)})" if skipped else ""))


def calibration_note(results: list[dict]) -> str | None:
    """A line for "how sure" on how the answer moves with the compute profile (the GPU-measured
    calibration, issue 36): which compute profile priced each case, and the recommended
    deployment's gain with compute 30 % slower / faster (sensitivity.py)."""
    from sempar.serving.sensitivity import sensitivity_text

    lines = []
    for res in results:
        lines += [x for x in (f"Compute for {res['model']} on {res['topology']}: "
                              f"{res['compute_model']}." if res.get("compute_model") else "",
                              sensitivity_text(res)) if x]
    return " ".join(lines) or None


def answer_section(report, results: list[dict], chart: Path | None = None) -> None:
    """The report's first screen: per model and topology the recommended deployment, its gain
    over SGLang's launch with its interval and what it is made of (balance, locality, request
    policy, pipeline); the gain chart; then how sure."""
    report.heading("Answer: what to deploy (forecast)")
    rows = []
    for res in results:
        base, win = res["baseline"], res["ranked"][0] if res["ranked"] else None
        if win is None or not win["throughput_under_slo"]:
            report.paragraph(f"{res['model']} on {res['topology']}: no deployment met the SLO.")
            continue
        each = "; ".join(f"{k} SLO {gain_text(win['under_each'][k], base['under_each'][k])}"
                         for k in res["slo_keys"])
        report.paragraph(
            f"{res['model']} on {res['topology']} (EP {win['ep']}): deploy {win['pipeline']} with "
            f"the {win['placement']} placement, request policy {win['policy']}, "
            f"{win['redundant']} redundant slots: {gain_text(win, base)} SGLang's launch "
            f"({win['throughput_under_slo']:,.0f} against {base['throughput_under_slo'] or 0:,.0f} "
            f"tokens/s under {' + '.join(res['slo_keys'])}; {each}). Made of: {_made_of(res)}. "
            f"{res['choice'].get('text', '')} The plan {compared_text(res)}.")
        ratio, low, high = _ratio_interval(win, base)
        rows.append([res["model"], res["topology"], f"{win['placement']}/{win['pipeline']}/"
                     f"{win['policy']} R={win['redundant']}", win["throughput_under_slo"],
                     base["throughput_under_slo"], ratio, low, high, res["noise"]])
    if chart is not None:
        report.image(chart, "gain over SGLang's launch under the SLO: every deployment forecast "
                     "in full (dark: recommended; whiskers: the rate search's interval), and the "
                     "recommended one's gain part by part (orange: each step x the one before)")
    if rows:
        report.table(["model", "topology", "deploy", "tokens/s under SLO", "SGLang tokens/s",
                      "x SGLang", "x low", "x high", "noise"], rows)
    tol = results[0]["search"]["tolerance"] if results else 0.02
    report.paragraph(
        "How sure: each figure is the highest request rate meeting the SLO, searched on the rate "
        f"(the grid brackets it, bisection narrows it to {tol:.0%}); the interval [x low, x high] "
        "is the ratio of the bracket ends (the deployment's rate that meets / SGLang's that "
        "misses, and the reverse). The noise is the spread of the figures over another arrival "
        "stream; deployments within it count as tied and the simpler one is recommended. "
        + "The f" + CAVEATS.removeprefix("How sure: the f")
        + " All-to-alls are priced with the links their pairs share (`nccl-links`; CAMoE's eq. "
        "9 alone priced them up to 10x too cheap on PCIe / UPI: docs/serving.md, \"The "
        "Attention-TP gap\").")
    note = calibration_note(results)
    if note:
        report.paragraph(note)


def evidence_section(report, res: dict, png: Path | None) -> None:
    """One plan's ranked deployments beside SGLang's launch, with the ratio to it, the
    attribution, the commands and the latency curves."""
    base = res["baseline"]
    slos = ", ".join(f"{k} {res['slos'][k] * 1e3:.1f} ms" for k in res["slo_keys"])
    report.heading(f"Plan: {res['model']} on {res['topology']} ({res['accelerator']} x "
                   f"{res['eps'][0]}), SLO {slos}", 3)
    rows = [["SGLang launch (baseline)", "vanilla", "sglang-ep", "round-robin",
             base["max_rate_under_slo"], base["throughput_under_slo"], 1.0, "-"]]
    for r in res["ranked"]:
        rows.append([f"#{len(rows)}", r["placement"], r["pipeline"], r["policy"],
                     r["max_rate_under_slo"], r["throughput_under_slo"],
                     _ratio_interval(r, base)[0], gain_text(r, base)])
    report.table(["deployment", "placement", "pipeline", "policy", "req/s under SLO",
                  "tokens/s under SLO", "x SGLang", "x SGLang [interval]"], rows)
    if res.get("attribution"):
        report.table(["part changed", "deployment", "tokens/s under SLO", "x previous step"],
                     [[p["part"], p["deployment"], p["throughput_under_slo"], p["gain"]]
                      for p in res["attribution"]])
    if res["ranked"]:
        report.table(["commands for the recommended deployment, as printed by `sempar plan`"],
                     [[c] for c in res["ranked"][0]["commands"]])
    if png is not None:
        report.image(png, "latency-throughput curves (grid rates; the SLO dashed)")
