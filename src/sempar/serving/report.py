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


# What each demo topology is, in words, so a heading never names GPUs the links are not of:
# the forecast prices compute with the accelerator (`--accelerator`) and links with the topology.
TOPOLOGY_WORDS = {
    "pcie-upi8": "one server, 2 sockets x 4 GPUs on PCIe joined by UPI",
    "a100x4-ib": "2 nodes x 4 GPUs, NVLink inside, InfiniBand between",
    "nvlink8": "one server, 8 GPUs on NVLink",
    "hetero-cloud": "CAMoE's emulated cloud, 4 nodes x 2 GPUs on shaped links",
}


def setup_text(res: dict) -> str:
    """"EP 8 on pcie-upi8 (what that is), H100 compute": the plan's devices, links and compute."""
    ep = (res.get("eps") or [r["ep"] for r in res.get("ranked") or []] or [None])[0]
    words = TOPOLOGY_WORDS.get(str(res["topology"]).split(":")[0])
    return (f"EP {ep} on {res['topology']}" + (f" ({words})" if words else "")
            + f", {str(res['accelerator']).upper()} compute")


def answer_line(res: dict) -> str:
    """One line per plan (the terminal's and the report's first screen): deploy what, the gain
    over SGLang's launch under the SLO and its interval."""
    base, win = res["baseline"], res["ranked"][0] if res["ranked"] else None
    head = f"{res['model']}, {setup_text(res)}"
    if win is None or not win["throughput_under_slo"]:
        return f"{head}: no deployment met the SLO"
    slots = f"{win['redundant']} redundant slots" if win["redundant"] else "no redundant slots"
    return (f"{head}: deploy {win['placement']} placement on {win['pipeline']}, "
            f"{win['policy']}, {slots}: {gain_text(win, base)} SGLang's launch under "
            f"{' + '.join(k.upper() for k in res['slo_keys'])}")


def answer_section(report, results: list[dict], chart: Path | None = None) -> None:
    """The report's first screen: one line per model and topology (the recommended deployment
    and its gain over SGLang's launch with its interval: `answer_line`, the lines `sempar demo`
    prints), the gain chart, then the details -- each gain under each SLO key, what it is made
    of (balance, locality, request policy, pipeline), what was compared -- and how sure."""
    report.heading("Answer: what to deploy (forecast)")
    report.items([answer_line(res) for res in results])
    if chart is not None:
        report.image(chart, "gain over SGLang's launch under the SLO: every deployment forecast "
                     "in full (dark: recommended; whiskers: the rate search's interval), and the "
                     "recommended one's gain part by part (orange: each step x the one before)")
    rows = []
    for res in results:
        base, win = res["baseline"], res["ranked"][0] if res["ranked"] else None
        if win is None or not win["throughput_under_slo"]:
            continue
        each = "; ".join(f"{k} SLO {gain_text(win['under_each'][k], base['under_each'][k])}"
                         for k in res["slo_keys"])
        report.paragraph(
            f"{res['model']}, {setup_text(res)}: deploy {win['pipeline']} with "
            f"the {win['placement']} placement, request policy {win['policy']}, "
            f"{win['redundant']} redundant slots: {gain_text(win, base)} SGLang's launch "
            f"({win['throughput_under_slo']:,.0f} against {base['throughput_under_slo'] or 0:,.0f} "
            f"tokens/s under {' + '.join(res['slo_keys'])}; {each}). Made of: {_made_of(res)}. "
            f"{res['choice'].get('text', '')} The plan {compared_text(res)}.", note=True)
        ratio, low, high = _ratio_interval(win, base)
        rows.append([res["model"], res["topology"], f"{win['placement']}/{win['pipeline']}/"
                     f"{win['policy']} R={win['redundant']}", win["throughput_under_slo"],
                     base["throughput_under_slo"], ratio, low, high, res["noise"]])
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
    report.heading(f"Plan: {res['model']}, {setup_text(res)}; SLO {slos}", 3)
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
