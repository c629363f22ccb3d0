"""`sempar demo`: every stage sempar has on the embedded default data, into report.html and
summary.json. `stages` holds the data and scheduling stages, `system` the downstream ones,
`run` runs them in registration order."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from sempar.commands._options import accelerator_profile_option, json_option
from sempar.console import emit_json


def demo(out_dir: Path = typer.Option(Path("sempar-demo"), "--out", help="folder for report.html"),
         as_json: bool = json_option("print summary.json on stdout"),
         force: bool = typer.Option(False, "--force", help="move a non-empty --out folder sempar "
                                    "did not write aside (never deleted)"),
         accelerator_profile: Optional[Path] = accelerator_profile_option()) -> None:
    """Run every stage sempar has on the embedded default data; write report.html and summary.json."""
    from sempar.atomic import check_folder_output
    from sempar.demo.run import run_demo

    check_folder_output(out_dir, force=force)
    if accelerator_profile is not None:         # refused before any stage runs
        from sempar.serving.accel_profile import load_profile

        load_profile(accelerator_profile)
    summary = run_demo(out_dir, force=force, accelerator_profile=accelerator_profile)
    if as_json:
        emit_json(summary)
        return
    from sempar.console import out
    from sempar.serving.report import answer_line

    serve = summary["stages"].get("serve") or {}
    lines = ["what to deploy (forecast, against SGLang's launch; [interval]):"]
    lines += [f"  {answer_line(case)}" for case in serve.get("cases", [])]
    lines.append(f"wrote {out_dir / 'report.html'} (the answer, the chart, then the details) "
                 f"and {out_dir / 'summary.json'}")
    for line in lines:
        out.print(line, soft_wrap=True, markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
