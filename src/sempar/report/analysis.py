"""One trace's affinity analysis with its figures (`sempar analyze` and the demo's analysis
stage): the contract JSON of affinity.analysis, a random router's control beside it, and the
PNGs of report.plots."""

from __future__ import annotations

from pathlib import Path


def analyze_to(trace_path: Path, devices: int, seed: int, max_tokens: int,
               fig_dir: Path | None, quiet: bool = False,
               control: bool = False) -> tuple[dict, dict[str, Path]]:
    """(contract JSON, {figure: path}) for one trace file; figures only when fig_dir is given.

    With `control`, result["control"] holds the summary of a random router of the same shape
    on the same tokens (affinity.control)."""
    from sempar.affinity.analysis import analyze_trace
    from sempar.progress import steps
    from sempar.trace import read_trace

    trace = read_trace(trace_path)
    if quiet:
        analysis = analyze_trace(trace, devices=devices, seed=seed, max_tokens=max_tokens)
    else:
        with steps("analyze", 4 if trace.domain is not None else 3) as step:
            analysis = analyze_trace(trace, devices=devices, seed=seed, max_tokens=max_tokens,
                                     progress=step)
    result = analysis.to_json()
    if control:
        from sempar.affinity.control import random_router_like

        ctrl = analyze_trace(random_router_like(trace, seed), devices=devices, seed=seed,
                             max_tokens=max_tokens, embed=False).to_json()
        result["control"] = {"summary": ctrl["summary"], "layers": ctrl["layers"]}
    plots: dict[str, Path] = {}
    if fig_dir is not None:
        from sempar.report.plots import plot_analysis

        plots = plot_analysis(analysis, fig_dir, trace.domains)
    return result, plots
