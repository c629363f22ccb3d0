"""Run every registered `sempar demo` stage into one folder: report.html and summary.json.

The data and scheduling stages (`demo.stages`) register before the downstream ones
(`demo.system`), which import them; this module imports both, so neither imports it.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

from sempar.atomic import atomic_folder, write_text_atomic
from sempar.demo import system  # noqa: F401  (registers the downstream stages)
from sempar.demo.stages import STAGES, DemoContext
from sempar.progress import steps
from sempar.console import json_text
from sempar.report.html import HtmlReport


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (solver workers): with the
    wall seconds, what a stage costs on a machine shared with other work."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run_demo(out_dir: Path, force: bool = False, accelerator_profile: Path | None = None) -> dict:
    """Run all stages; write out_dir/report.html and out_dir/summary.json. Returns the summary.

    The folder is written by the output rule of `sempar.atomic.atomic_folder`: a non-empty
    folder sempar did not write is refused (or moved aside with `force`), never deleted."""
    summary: dict = {"stages": {}, "seconds": {}, "cpu_seconds": {}}
    with atomic_folder(out_dir, "demo", force=force) as tmp:
        ctx = DemoContext(work=Path(tmp), report=HtmlReport("sempar demo"), out=Path(out_dir),
                          accelerator_profile=accelerator_profile)
        with steps("demo", len(STAGES)) as step:
            for name in STAGES:
                step(name)
                t0, c0 = time.perf_counter(), _cpu()
                ctx.results[name] = STAGES.get(name)(ctx)
                summary["seconds"][name] = round(time.perf_counter() - t0, 2)
                summary["cpu_seconds"][name] = round(_cpu() - c0, 2)
        summary["stages"] = ctx.results
        ctx.report.write(ctx.work / "report.html")
        write_text_atomic(ctx.work / "summary.json", json_text(summary, indent=1) + "\n")
    return summary
