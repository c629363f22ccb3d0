"""`sempar calibrate`: measure the operator blocks the serving forecast prices on the local
device into an accelerator profile; `calibrate check` prices measurement lines with the forecast;
`calibrate convert` turns measurement lines into a profile (docs/calibrate.md).

    sempar calibrate --out h100.json [--device cuda] [--quick] [--models gpt-oss-20b,...]
        [--measurements-out h100.jsonl] [--max-seconds 360]
    sempar calibrate check --accelerator h100 [--accelerator-profile P.json]
        --measurements M.jsonl [--holdout] [--json]
    sempar calibrate convert --measurements M.jsonl --accelerator h100 --out P.json

Module level imports only typer and sempar's light modules: the verb must load on a GPU machine
with only torch, numpy, typer, rich, scipy and pyarrow (tests/calibrate/test_calibrate.py checks it).
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import bound
from sempar.commands._names import accelerators, names_option
from sempar.commands._options import json_option

cal_app = typer.Typer(add_completion=False, help="Measure the forecast's operator blocks on "
                      "this device (an accelerator profile); check the forecast against "
                      "measurements.")

# The demo's models first: a run cut short by --max-seconds has measured them.
FIRST = ("gpt-oss-20b", "deepseek-v2-lite", "qwen3-30b-a3b")


def _models(models: Optional[str], model_dir: Optional[Path], device: str) -> list:
    from sempar.calibrate.lines import dims_from_dir, model_dims, preset_models
    from sempar.errors import InputError

    if model_dir is not None:
        return [dims_from_dir(model_dir)]
    if models:
        return [model_dims(m.strip()) for m in models.split(",") if m.strip()]
    if device == "cpu":
        return [model_dims("tiny-moe64")]
    found = preset_models()
    if not found:
        raise InputError("calibrate: the preset table is empty")
    return sorted(found, key=lambda d: (FIRST.index(d.name) if d.name in FIRST else len(FIRST), d.name))


def _accelerator_name(info: dict, given: Optional[str]) -> str:
    from sempar.serving.hardware import ACCELERATORS

    if given:
        ACCELERATORS.get(given)
        return given
    name = info.get("device", "").lower()
    for key in ("h200", "h100", "a100"):
        if key in name:
            return key
    return "cpu" if name.startswith("cpu") else "h100"


def _write(path: Path, text: str, option: str) -> None:
    from sempar.atomic import write_text_atomic

    write_text_atomic(path, text, option=option)


@cal_app.callback(invoke_without_command=True)
def calibrate_cmd(
    ctx: typer.Context,
    out_path: Optional[Path] = typer.Option(None, "--out", help="the profile to write (JSON)"),
    device: str = typer.Option("cuda", "--device", help="cuda (or cuda:N) or cpu (a tiny grid: "
                               "CI runs the code path)"),
    quick: bool = typer.Option(False, "--quick", help="a third of the points (a short device slot)"),
    models: Optional[str] = typer.Option(None, "--models", help="comma-separated presets "
                                         "(default: every preset; cpu: tiny-moe64)"),
    model_dir: Optional[Path] = typer.Option(None, "--model-dir", help="a checkpoint folder "
                                             "whose config.json gives the shapes"),
    accelerator: Optional[str] = names_option(None, "--accelerator", accelerators, single=True,
                                              help="the registered accelerator the profile is "
                                                   "for (default: from the device's name)"),
    lines_out: Optional[Path] = typer.Option(None, "--measurements-out", help="also write the "
                                             "measurement lines (JSONL, `calibrate check`'s input)"),
    reps: int = typer.Option(20, "--reps", help="timed replays per case (the median is kept)",
                             callback=bound(1, 1000)),
    warmup: int = typer.Option(3, "--warmup", help="eager runs before capture",
                               callback=bound(1, 100)),
    max_seconds: float = typer.Option(360.0, "--max-seconds", help="stop measuring after this "
                                      "long; what was measured is written (the source says so)",
                                      callback=bound(1, 86400)),
    as_json: bool = json_option(),
) -> None:
    """Measure the operator blocks the forecast prices on this device into a profile."""
    if ctx.invoked_subcommand is not None:
        return
    from sempar.errors import InputError

    if out_path is None:
        raise InputError("calibrate: --out PROFILE.json is required (or a subcommand: check, "
                         "convert)")
    dev = device.strip().lower()
    if not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise InputError(f"--device {device!r}: cuda, cuda:N or cpu")
    from sempar.output_rule import check_distinct_outputs, check_output

    check_distinct_outputs(("--out", out_path), ("--measurements-out", lines_out))
    check_output(out_path, option="--out")
    if lines_out is not None:
        check_output(lines_out, option="--measurements-out")
    dims = _models(models, model_dir, dev)
    from sempar.calibrate.cases import GRIDS, cases
    from sempar.calibrate.measure import Bench, cuda_available, device_info

    if dev != "cpu" and not cuda_available():
        raise InputError("calibrate: no CUDA device here (--device cpu runs the tiny CPU grid)")
    grid = GRIDS["cpu" if dev == "cpu" else ("quick" if quick else "full")]
    todo = cases(dims, grid)
    info = device_info(dev)
    acc_name = _accelerator_name(info, accelerator)
    bench = Bench(dev, warmup=warmup, reps=reps)
    done, lines, refused = [], [], []
    t0 = time.perf_counter()
    from sempar.calibrate.lines import line_of
    from sempar.progress import steps

    with steps("calibrate", len(todo)) as step:
        for c in todo:
            if time.perf_counter() - t0 > max_seconds:
                break
            step(f"{c['model']} {c['op']} {c['tokens']}")
            r = bench.measure(c)
            if "error" in r:
                refused.append({**line_of(c, 0.0, with_dims=model_dir is not None),
                                "error": r["error"]})
                continue
            done.append({**c, "measured_us": r["measured_us"]})
            lines.append({**line_of(c, r["measured_us"], with_dims=model_dir is not None),
                          "graph": r["graph"]})
    if not done:
        raise InputError(f"calibrate: no case could be measured ({refused[0]['error'] if refused else 'none ran'})")
    from sempar.serving.accel_profile import build_profile

    source = {"kind": "measured", **info, "date": datetime.date.today().isoformat(),
              "grid": "cpu" if dev == "cpu" else ("quick" if quick else "full"),
              "cases": f"{len(done)} of {len(todo)} measured, {len(refused)} refused",
              "timing": (f"CUDA graph replays, median of {reps} after {warmup} warm-up runs"
                         if dev != "cpu" else f"eager, median of {reps} after {warmup} warm-up runs"),
              "command": "sempar calibrate"}
    prof = build_profile(acc_name, source, done)
    from sempar.console import json_text

    _write(out_path, json_text(prof.to_json()) + "\n", "--out")
    if lines_out is not None:
        import json

        head = {"device": info.get("device"), "torch": info.get("torch"), "date": source["date"]}
        _write(lines_out, "\n".join(json.dumps(x) for x in [head, *lines, *refused]) + "\n",
               "--measurements-out")
    res = {"profile": str(out_path), "accelerator": acc_name, "source": source,
           "measured": len(done), "planned": len(todo), "refused": len(refused),
           "seconds": time.perf_counter() - t0, "fixed_us": prof.fixed_us}
    if as_json:
        from sempar.console import emit_json

        emit_json(res)
        return
    from sempar.console import out

    out.print(f"calibrate: {len(done)} of {len(todo)} cases measured on {info.get('device')} "
              f"({len(refused)} refused) in {res['seconds']:.0f} s -> {out_path} "
              f"(accelerator {acc_name}); fixed cost per block (us): "
              + ", ".join(f"{k} {v:.1f}" for k, v in prof.fixed_us.items()))


@cal_app.command("check")
def check_cmd(
    accelerator: str = names_option("h100", "--accelerator", accelerators, single=True,
                                    help="the accelerator forecast"),
    profile: Optional[Path] = typer.Option(None, "--accelerator-profile", help="a profile "
                                           "instead of the shipped one"),
    measurements: list[Path] = typer.Option(..., "--measurements", help="measurement lines "
                                            "(JSONL, the schema of shared/data/h100-kernels); "
                                            "repeatable"),
    holdout: bool = typer.Option(False, "--holdout", help="price each line by a profile "
                                 "converted from all the other lines (interpolation error)"),
    as_json: bool = json_option(),
) -> None:
    """The forecast's time of each measured operator block beside the measurement."""
    from dataclasses import replace

    from sempar.calibrate.check import check
    from sempar.calibrate.lines import read_lines
    from sempar.serving.accel_profile import compute_model, load_profile
    from sempar.serving.hardware import ACCELERATORS

    acc = ACCELERATORS.get(accelerator)
    if profile is not None:
        acc = replace(acc, profile=load_profile(profile))
    lines = []
    for m in measurements:
        lines += read_lines(m)[1]
    res = check(lines, acc, holdout_from=accelerator if holdout else None,
                source={"kind": "converted", "from": "the other lines (--holdout)"})
    res = {**res, "accelerator": accelerator, "holdout": holdout,
           "compute_model": ("leave-one-out profiles of the measurements" if holdout
                             else compute_model(acc))}
    if as_json:
        from sempar.console import emit_json

        emit_json(res)
        return
    from rich.table import Table

    from sempar.console import out

    t = Table(title=f"calibrate check: {accelerator}, {res['compute_model']}")
    for col in ("model", "op", "shape", "measured us", "forecast us", "forecast / measured",
                "roofline / measured"):
        t.add_column(col, justify="left" if col in ("model", "op", "shape") else "right")
    for ln in res["lines"]:
        shape = (f"EP {ln.get('ep')} E {ln.get('E')} T {ln.get('T')}" if ln["op"] == "moe_block"
                 else " ".join(f"{k} {ln[k]}" for k in ("phase", "tokens", "context") if k in ln))
        t.add_row(str(ln.get("model")), ln["op"], shape, f"{ln['measured_us']:.1f}",
                  f"{ln['predicted_us']:.1f}", f"{ln['predicted_us'] / ln['measured_us']:.3f}",
                  f"{ln['roofline_us'] / ln['measured_us']:.3f}")
    out.print(t)
    out.print(f"{len(res['lines'])} lines: median |forecast / measured - 1| "
              f"{res['median_abs_error']:.3f}, 90th percentile {res['p90_abs_error']:.3f}, worst "
              f"{res['max_abs_error']:.3f}; {res['within_0_20']:.0%} within 0.20")


@cal_app.command("convert")
def convert_cmd(
    measurements: list[Path] = typer.Option(..., "--measurements", help="measurement lines "
                                            "(JSONL); repeatable"),
    accelerator: str = names_option("h100", "--accelerator", accelerators, single=True,
                                    help="the accelerator the profile is for"),
    out_path: Path = typer.Option(..., "--out", help="the profile to write (JSON)"),
    date: Optional[str] = typer.Option(None, "--date", help="when the lines were measured "
                                       "(default: the files' header, else unknown)"),
    source_note: Optional[str] = typer.Option(None, "--from", help="where the lines come from "
                                              "(default: the file names)"),
    as_json: bool = json_option(),
) -> None:
    """An accelerator profile converted from measurement lines (no device needed)."""
    from sempar.output_rule import check_output
    from sempar.calibrate.check import convert
    from sempar.calibrate.lines import read_lines
    from sempar.console import json_text
    from sempar.serving.hardware import ACCELERATORS

    ACCELERATORS.get(accelerator)
    check_output(out_path, *measurements, option="--out")
    header, lines = {}, []
    for m in measurements:
        h, ls = read_lines(m)
        header.update(h)
        lines += ls
    source = {"kind": "converted", "from": source_note or ", ".join(p.name for p in measurements),
              "device": str(header.get("device", "unknown")),
              "torch": str(header.get("torch", "unknown")),
              "date": date or str(header.get("date", "unknown")),
              "command": "sempar calibrate convert"}
    prof = convert(lines, accelerator, source)
    _write(out_path, json_text(prof.to_json()) + "\n", "--out")
    res = {"profile": str(out_path), "accelerator": accelerator, "lines": len(lines),
           "entries": len(prof.entries), "fixed_us": prof.fixed_us, "source": source}
    if as_json:
        from sempar.console import emit_json

        emit_json(res)
        return
    from sempar.console import out

    out.print(f"calibrate convert: {len(lines)} lines -> {len(prof.entries)} curves -> {out_path}")


def register(app: typer.Typer) -> None:
    app.add_typer(cal_app, name="calibrate")
