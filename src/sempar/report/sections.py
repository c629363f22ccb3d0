"""Report sections: each turns one stage's JSON (and its PNGs) into HTML and a rich table."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from sempar.report.html import HtmlReport, fmt


def trace_rows(info: dict) -> list[tuple[str, object]]:
    rows = [(key, info.get(key)) for key in ("model", "tokens", "requests", "layers", "experts",
                                             "top_k", "shared_experts", "vocab_size")]
    rows += [(f"domain {d}", n) for d, n in info.get("domains", {}).items()]
    return rows


def table1_rows(result: dict) -> list[list[object]]:
    return [[l["layer"], l["f1"]["p25"], l["f1"]["p50"], l["f1"]["p75"],
             l["cum_hotness_topk"]["p25"], l["cum_hotness_topk"]["p50"],
             l["cum_hotness_topk"]["p75"], l["max_hotness_non_topk"]["p25"],
             l["max_hotness_non_topk"]["p50"], l["max_hotness_non_topk"]["p75"],
             l["kurtosis_p50"]] for l in result["layers"]]


TABLE1_HEADER = ["layer", "F1 p25", "F1 p50", "F1 p75", "cum hot p25", "cum hot p50",
                 "cum hot p75", "max non-top-k p25", "p50", "p75", "kurtosis p50"]


def summary_rows(result: dict) -> list[tuple[str, object]]:
    s = result["summary"]
    rows = [("F1 of static top-k, p50 (mean over layers)", s["f1_p50_mean"]),
            ("F1 of static top-k, mean", s.get("f1_mean")),
            ("cumulative hotness of top-k, p50", s["cum_hotness_topk_p50_mean"]),
            ("max hotness of non-top-k, p50", s["max_hotness_non_topk_p50_mean"]),
            ("kurtosis p50", s.get("kurtosis_p50_mean")),
            ("inter-layer top-k mass (uniform = %.3f)" % s["transition_uniform"],
             s.get("transition_topk_mass_mean"))]
    for n, acc in enumerate(s["lookback_accuracy"], start=1):
        rows.append((f"look-back {n}: expert / device accuracy",
                     f"{fmt(acc)} / {fmt(s['lookback_accuracy_device'][n - 1])}"))
    ctrl = result.get("control")
    if ctrl:
        c = ctrl["summary"]
        rows.append(("random-router control: F1 mean / cum hotness p50 / kurtosis p50",
                     f"{fmt(c['f1_mean'])} / {fmt(c['cum_hotness_topk_p50_mean'])} / "
                     f"{fmt(c['kurtosis_p50_mean'])}"))
        rows.append(("random-router control: look-back 5 / inter-layer top-k mass",
                     f"{fmt(c['lookback_accuracy'][-1])} / {fmt(c['transition_topk_mass_mean'])}"))
    req = result.get("requests")
    if req:
        rows.append(("requests: domain silhouette", req["silhouette"]))
        rows.append(("requests: 5-NN domain purity (chance)",
                     f"{fmt(req['knn_purity'])} ({fmt(req['knn_chance'])})"))
    return rows


def analysis_table(result: dict) -> Table:
    """A rich table of the headline figures, for the terminal."""
    t = Table(title=f"analysis of {result['trace']['model']}", show_header=False)
    for k, v in summary_rows(result):
        t.add_row(k, fmt(v))
    for B, d in result["load_tail"].items():
        t.add_row(f"batch {B}: max/mean load, experts idle",
                  f"{fmt(d['max_over_mean'])}, {fmt(d['zero_share'])}")
    return t


def add_analysis(report: HtmlReport, result: dict, plots: dict[str, Path], title: str) -> None:
    report.heading(title)
    report.table(["trace", ""], trace_rows(result["trace"]))
    if result.get("sampled"):
        report.paragraph(f"Analysed {result['sampled']['tokens']} of "
                         f"{result['sampled']['from_tokens']} tokens (whole requests).", note=True)
    report.heading("Token-expert affinity (Sem-MoE Table 1, A.2)", 3)
    report.table(["figure", "value"], summary_rows(result))
    report.image(plots["table1"], "Per layer: static top-k F1 (fit on 25% of tokens, scored on "
                 "75%), cumulative hotness of the top-k and max hotness of the non-top-k.")
    report.table(TABLE1_HEADER, table1_rows(result))
    report.image(plots["kurtosis"], "Kurtosis of per-token activation maps (middle layer).")
    report.heading("Inter-layer affinity (Sem-MoE A.2, ExFlow)", 3)
    report.image(plots["transitions"], "Conditional probability of the next layer's expert "
                 "(top) and device (bottom, contiguous layout).")
    report.image(plots["lookback"], "Accuracy of predicting layer l from the top-1 path of the "
                 "previous n layers.")
    if "requests" in plots:
        report.heading("Requests by domain (Sem-MoE A.1)", 3)
        report.image(plots["requests"], "Per-request expert activation vectors, t-SNE.")
    report.heading("Per-batch expert load (FSE-DP Fig. 2)", 3)
    report.table(["batch tokens", "max/mean", "experts idle", "top-10% share", "single-token"],
                 [[B, d["max_over_mean"], d["zero_share"], d["top10_share"],
                   d["single_token_share"]] for B, d in result["load_tail"].items()])
    report.image(plots["load_tail"], "Mean sorted per-expert load of a batch.")


def add_aggregates(report: HtmlReport, real: dict, plots: list[Path]) -> None:
    """The real OLMoE / Mixtral routing aggregates beside our traces."""
    report.heading("Real routing: OLMoE-1B-7B and Mixtral-8x7B aggregates")
    report.paragraph(f"Source: {real.get('source')}. Only layers 0, 7 and 15 were recorded; no "
                     "token order survives, so F1 cannot be measured (its in-sample bound equals "
                     "the cumulative hotness) and look-back prediction is not available.", note=True)
    rows = []
    for name, m in real.get("models", {}).items():
        s = m.get("summary", {})
        rows.append([name, s.get("cum_hotness_topk_p50_mean"), s.get("max_hotness_non_topk_p50_mean"),
                     s.get("kurtosis_p50_mean"), s.get("domain_js_mean"),
                     s.get("crosslayer_topk_mass_mean")])
    report.table(["model", "cum hot top-k p50", "max non-top-k p50", "kurtosis p50",
                  "domain JS distance", "cross-layer top-k mass"], rows)
    for name, m in real.get("models", {}).items():
        if not m.get("layers") or "cum_hotness_topk" not in m["layers"][0]:
            continue  # instruction-tuned variants: expert counts only
        report.heading(f"{name}: per layer", 3)
        report.table(["layer", "cum hot p25", "p50", "p75", "max non-top-k p50", "kurtosis p50",
                      "tokens"],
                     [[l["layer"], l["cum_hotness_topk"]["p25"], l["cum_hotness_topk"]["p50"],
                       l["cum_hotness_topk"]["p75"], l["max_hotness_non_topk"]["p50"],
                       l.get("kurtosis_p50"), l.get("tokens")] for l in m["layers"]])
    for p in plots:
        report.image(Path(p), Path(p).stem)


def add_comparison(report: HtmlReport, ours: dict[str, dict], real: dict) -> None:
    """Our traces (and their random-router controls) beside the real models' aggregates."""
    report.heading("Our routing beside real models")
    rows = []
    for name, r in ours.items():
        s = r["summary"]
        rows.append([name, s["cum_hotness_topk_p50_mean"], s["max_hotness_non_topk_p50_mean"],
                     s.get("kurtosis_p50_mean"), s.get("f1_mean"), s["lookback_accuracy"][-1]])
        if r.get("control"):
            c = r["control"]["summary"]
            rows.append([f"{name}: random router", c["cum_hotness_topk_p50_mean"],
                         c["max_hotness_non_topk_p50_mean"], c.get("kurtosis_p50_mean"),
                         c.get("f1_mean"), c["lookback_accuracy"][-1]])
    for name, m in real.get("models", {}).items():
        s = m.get("summary", {})
        if "cum_hotness_topk_p50_mean" in s:
            rows.append([f"real {name}", s["cum_hotness_topk_p50_mean"],
                         s["max_hotness_non_topk_p50_mean"], s.get("kurtosis_p50_mean"),
                         None, None])
    report.table(["routing", "cum hot top-k p50", "max non-top-k p50", "kurtosis p50",
                  "F1 mean (25/75)", "look-back 5"], rows)
    report.paragraph("Real aggregates hold no per-occurrence sets or token order, so F1 and "
                     "look-back accuracy cannot be measured on them.", note=True)
