"""The serving forecast as a report section (`sempar demo`): the plan first -- what to deploy,
what it buys against SGLang's baseline, how sure the forecast is -- then the systems side by
side (throughput under each SLO) and the latency-throughput curves."""

from __future__ import annotations

from pathlib import Path

from sempar.serving.metrics import SLO_KEYS

CAVEATS = ("How sure: the forecast is a model, not a measurement. Compute is a roofline at 60% "
           "of peak FLOP/s and 80% of peak bandwidth (serving/hardware.py), communication is "
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


def plan_section(report, plan_res: dict) -> None:
    ranked, base = plan_res["ranked"], plan_res["baseline"]["throughput_under_slo"]
    report.heading("Plan: what to deploy (forecast)")
    if not ranked:
        report.paragraph("No deployment met the SLO at the lowest swept rate.")
        return
    win = ranked[0]
    thr = win["throughput_under_slo"]
    gain = f"{thr / base:.2f}x SGLang's baseline ({base:.0f} tokens/s)" if thr and base else "n/a"
    slos = ", ".join(f"{k} {plan_res['slos'][k] * 1e3:.1f} ms" for k in plan_res["slo_keys"])
    report.paragraph(f"Deploy {win['pipeline']} with the {win['placement']} placement, request "
                     f"policy {win['policy']}, {win['redundant']} redundant slots, EP {win['ep']} "
                     f"on {plan_res['topology']} ({plan_res['accelerator']}): "
                     f"{thr or 0:.0f} tokens/s under the SLO ({slos}), {gain}.")
    report.table(["rank", "pipeline", "placement", "policy", "EP", "LAR", "tokens/s under SLO"],
                 [[i, r["pipeline"], r["placement"], r["policy"], r["ep"], r["lar"],
                   r["throughput_under_slo"]] for i, r in enumerate(ranked, 1)])
    report.paragraph("Commands: " + " && ".join(c for c in win["commands"] if not c.startswith("#")))
    report.paragraph(CAVEATS, note=True)


def systems_section(report, res: dict, png: Path | None) -> None:
    report.heading(f"Serving forecast: systems side by side ({res['model']}, {res['topology']}, "
                   f"{res['accelerator']} x {res['ep']})")
    report.paragraph("Max request rate and token throughput meeting each SLO; each system is "
                     "judged against its attention mode's SLOs: " + slo_text(res), note=True)
    report.table(["system", "placement", "pipeline", "LAR"] + [f"{k} tok/s" for k in SLO_KEYS],
                 [[n, s["config"]["placement"], s["config"]["pipeline"], s["config"]["lar"]]
                  + [s["throughput_under_slo"][k] for k in SLO_KEYS]
                  for n, s in res["systems"].items()])
    if png is not None:
        report.image(png, "latency-throughput curves")
