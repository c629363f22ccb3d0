"""Hostile option values, enumerated from the typer app itself (issue 27, kinds 3, 4, 7, 10, 11).

Every numeric option of every verb, found by walking `sempar.cli.app` (a new option is covered
without a change here), is declared with a bound from `sempar.bounds`; NaN, infinities, values
beyond either end and non-integers for integer options are one line `error: ...` naming the
option, exit code 2, no traceback. Every option naming registered items refuses an unknown
name. Options a pipeline or strategy does not take are refused. `--json` is strict JSON.
The cases run in-process through `sempar.cli.main`; each is refused while the command line is
parsed, so none starts work. test_bad_input.py holds the one-case-per-class list.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile import run
from sempar.cli import app
from sempar.paths import assets_dir

TRACE = assets_dir() / "traces" / "tiny-moe64.parquet"


# ---- the app's options ---------------------------------------------------------------------

def _commands(cmd, path=()):
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, cmd


def _number_kind(p) -> type | None:
    """int or float for a numeric option (typer's annotation, or click's type), else None."""
    if getattr(p, "is_flag", False):
        return None
    desc = getattr(p, "type_descriptor", None)
    ann = getattr(desc, "annotation", None)
    if ann in (int, float):
        return ann
    name = getattr(getattr(p, "type", None), "name", "")
    return {"integer": int, "float": float}.get(name)


ROOT = typer.main.get_command(app)
PARAMS = [(path, p) for path, cmd in _commands(ROOT) for p in cmd.params
          if getattr(p, "opts", None) and p.opts[0].startswith("--")]
NUMERIC = [(path, p) for path, p in PARAMS if _number_kind(p)]
BOUNDED = [(path, p) for path, p in PARAMS if hasattr(p.callback, "bounds")]
NAMED = [(path, p) for path, p in PARAMS if hasattr(p.callback, "registry")]


def _id(case) -> str:
    path, p = case
    return f"{' '.join(path)} {max(p.opts, key=len)}"


def test_every_numeric_option_is_bounded():
    """An int or float option without a `sempar.bounds` callback would take NaN, 2^63 or -1."""
    assert len(NUMERIC) > 50
    unbounded = [_id(c) for c in NUMERIC if not hasattr(c[1].callback, "bounds")]
    assert unbounded == []


def test_number_list_options_are_found():
    """The comma-separated numbers (`--rates`, `--ep` of plan, `--lambdas`, `--redundant`)."""
    lists = {_id(c) for c in BOUNDED if hasattr(c[1].callback, "number_list")}
    assert {"plan --rates", "serve-sim --rates", "plan --ep", "plan --redundant",
            "cost-route sweep --lambdas"} <= lists


# ---- running a command line ----------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _in_empty_folder(tmp_path_factory):
    """Every case runs in an empty folder; a refused run must leave it empty."""
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("hostile"))
    yield
    os.chdir(old)


def refused(args: list[str], *needles: str) -> str:
    """Assert the contract of a refusal; returns the error line."""
    code, out, err = run(args)
    lines = err.strip().splitlines()
    assert code == 2, (args, code, err[-1500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, err[-1500:])
    assert "Traceback" not in err and out == ""
    for n in needles:
        assert n in lines[0], (args, lines[0])
    assert os.listdir(".") == [], "a refused run wrote a file"
    return lines[0]


# ---- kind 3: any hostile number for any numeric option -------------------------------------

def _text(v) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))


def hostile(b, integer: bool):
    """Values the bounds `b` refuse: non-finite, beyond either end, non-integers for integers."""
    options = [st.sampled_from(["nan", "inf", "-inf", "1e400", "-1e400"])]
    if b.hi is not None:
        hi_int = math.floor(b.hi) if not b.hi_open else math.ceil(b.hi) - 1
        options.append(st.integers(min_value=hi_int + 1, max_value=2**70).map(str))
        if not integer:
            options.append(st.floats(min_value=b.hi, max_value=1e300).filter(
                lambda x: x > b.hi or (b.hi_open and x == b.hi)).map(_text))
    if b.lo is not None:
        lo_int = math.ceil(b.lo) if not b.lo_open else math.floor(b.lo) + 1
        options.append(st.integers(min_value=-2**70, max_value=lo_int - 1).map(str))
        if not integer:
            options.append(st.floats(min_value=-1e300, max_value=b.lo).filter(
                lambda x: x < b.lo or (b.lo_open and x == b.lo)).map(_text))
    if integer:
        options.append(st.floats(min_value=-1e6, max_value=1e6).filter(
            lambda x: not float(x).is_integer()).map(_text))
    return st.one_of(options)


@pytest.mark.parametrize("case", BOUNDED, ids=[_id(c) for c in BOUNDED])
def test_hostile_number_is_one_line_exit_2(case):
    path, p = case
    b = p.callback.bounds
    integer = b.integer or _number_kind(p) is int
    opt = max(p.opts, key=len)

    @settings(max_examples=12, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(hostile(b, integer))
    def check(value: str):
        refused([*path, opt, value], opt)

    check()


def test_bounds_declare_the_work_caps():
    """The products that set the work are bounded, with their reason, in bounds.py."""
    import sempar.bounds as B

    assert B.REQUESTS_MAX * 1e3 < 2**31 and B.MICRO_SLICE_WORK_MAX >= 100 * 8**3
    refused(["serve-sim", "--trace", TRACE, "--rates", "1000", "--duration", "1000"],
            "--rates x --duration", "200000")
    refused(["plan", "--trace", TRACE, "--rates", "10,5000", "--duration", "60"],
            "--rates x --duration")
    refused(["stream", "--micro-slices", "128", "--strategy", "fsedp"],
            "--iterations x --micro-slices^3", "at most 12 iterations")
    refused(["stream", "--micro-slices", "4096"], "--micro-slices: 4096 is above the limit 256")
    refused(["plan", "--trace", TRACE, "--rates", ",".join(["1"] * 101)], "at most 100")


@pytest.mark.parametrize("args,needle", [
    (["plan", "--ep", "8.9"], "--ep: '8.9' is not an integer"),
    (["plan", "--redundant", "1.5"], "--redundant: '1.5' is not an integer or G"),
    (["plan", "--redundant", "2,G,x"], "--redundant: 'x'"),
    (["serve-sim", "--slo", "e2e=inf"], "--slo e2e: inf is not a finite number"),
    (["serve-sim", "--slo", "e2e=nan"], "--slo e2e: nan is not a finite number"),
    (["plan", "--slo", "ttft=1e9"], "--slo ttft: 1000000000.0 is above the limit"),
    (["serve-sim", "--slo", "e2e=0"], "--slo e2e: 0.0 must be above 0"),
    (["serve-sim", "--seed", str(2**64)], "--seed: 18446744073709551616 is above the limit"),
    (["serve-sim", "--token-budget", str(2**63 - 1)], "--token-budget"),
    (["cost-route", "sweep", "--lambdas", "0,-1"], "--lambdas: -1.0 must be at least 0"),
], ids=lambda x: x if isinstance(x, str) else " ".join(x[:2]))
def test_parsed_numbers_are_bounded(args, needle):
    refused(args, needle)


# ---- kind 7: names and options that do not apply --------------------------------------------

def test_name_options_are_found():
    names = {_id(c) for c in NAMED}
    assert {"plan --methods", "plan --pipelines", "plan --policies", "simulate --policy",
            "simulate --pipeline", "serve-sim --systems", "stream --strategy",
            "bench --methods"} <= names


@pytest.mark.parametrize("case", NAMED, ids=[_id(c) for c in NAMED])
def test_unknown_name_is_refused_naming_the_known(case):
    path, p = case
    opt = max(p.opts, key=len)
    registry = p.callback.registry()
    line = refused([*path, opt, "magic"], opt, "'magic'", "choose one of")
    assert all(n in line for n in registry.names())
    first = registry.names()[0]
    if p.callback.single:
        refused([*path, opt, f"{first},{first}"], opt, "give one")
    else:
        refused([*path, opt, f"{first},magic"], opt, "'magic'")


@pytest.mark.parametrize("args,needle", [
    (["simulate", "--trace", "none.parquet", "--placement", "magic"], "--placement: 'magic' is neither"),
    (["simulate", "--trace", "none.parquet", "--placement", "vanilla,magic", "--compare"],
     "--placement: 'magic'"),
    (["simulate", "--trace", "none.parquet", "--topology", "magic"], "unknown topology 'magic'"),
    (["simulate", "--trace", "none.parquet", "--pipeline", "smoe,attn-dp"], "give --compare"),
    (["place", "--trace", "none.parquet", "--method", "magic"], "--method: unknown placement method"),
], ids=lambda x: x if isinstance(x, str) else " ".join(x[3:5]))
def test_name_or_file_options_refuse_unknown_names(args, needle):
    """Options taking a registered name or a file: an unknown name is refused before any work."""
    refused(args, needle)


KNOB_FLAGS = {"dedup": ["--dedup"], "one_shot": ["--one-shot"], "schedule": ["--schedule", "online"],
              "policy": ["--policy", "balanced"], "count_sag": ["--no-count-sag"],
              "logit_bytes": ["--logit-bytes", "2"]}


def _pipelines():
    from sempar.comm.pipelines import PIPELINES, pipeline_names

    return [PIPELINES.get(n) for n in pipeline_names()]


@pytest.mark.parametrize("pipe", _pipelines(), ids=lambda p: p.name)
def test_simulate_refuses_options_its_pipeline_does_not_take(pipe):
    """Each pipeline's registered knobs (comm/pipelines.py) say which options apply."""
    assert set(pipe.knobs) <= set(KNOB_FLAGS)
    for knob, flag in KNOB_FLAGS.items():
        if knob not in pipe.knobs:
            refused(["simulate", "--trace", "none.parquet", "--pipeline", pipe.name, *flag],
                    flag[0], "does not apply to --pipeline")


def test_option_taken_by_one_compared_pipeline_is_accepted():
    """--compare: an option applies when any compared pipeline takes it (refused next: --png)."""
    refused(["simulate", "--trace", TRACE, "--pipeline", "sglang-tp,attn-dp", "--compare",
             "--policy", "balanced", "--png", "/etc/passwd/x.png"], "--png")


def test_policy_without_online_homes_is_refused():
    refused(["simulate", "--trace", TRACE, "--pipeline", "attn-dp", "--policy", "fifo"],
            "--policy: unknown request policy 'fifo'")
    refused(["simulate", "--trace", TRACE, "--pipeline", "attn-dp", "--policy", "alg2",
             "--schedule", "none"], "--policy: does not apply with --schedule none")


def test_stream_refuses_micro_slices_without_a_flow_strategy():
    refused(["stream", "--strategy", "ep,hydra", "--micro-slices", "8"],
            "--micro-slices: does not apply to --strategy ep,hydra")


# ---- kind 11: --json is strict JSON ----------------------------------------------------------

def _no_constants(name):
    raise AssertionError(f"{name} in --json output")


def _nested(kids):
    return st.one_of(st.lists(kids, max_size=4), st.tuples(kids, kids),
                     st.dictionaries(st.text(max_size=4), kids, max_size=4))


JSONABLE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
              st.floats().map(np.float64), st.floats(width=32).map(np.float32)),
    _nested, max_leaves=10)


@settings(max_examples=100, deadline=None)
@given(JSONABLE)
def test_json_writer_is_strict_json(obj):
    from sempar.console import json_text

    json.loads(json_text(obj), parse_constant=_no_constants)


def test_json_writer_writes_null_for_non_finite():
    from sempar.console import json_text

    obj = {"a": float("nan"), "b": [np.float32("inf"), -math.inf, 1.5], "c": np.array([np.nan, 2])}
    assert json.loads(json_text(obj)) == {"a": None, "b": [None, None, 1.5], "c": [None, 2.0]}


def test_reports_go_through_the_one_json_writer():
    """No verb formats its `--json` or JSON report itself (console.json_text / emit_json)."""
    import re

    src = Path(__file__).parents[2] / "src" / "sempar"
    stray = [str(p.relative_to(src)) for p in (src / "commands").rglob("*.py")
             if re.search(r"json\.dumps\((result|summary|res|out)\b", p.read_text())]
    assert stray == []


@pytest.mark.slow
def test_stream_sweeps_json_is_strict():
    """The sweeps hold NaN where a buffer cannot hold two micro-slices (kind 11's case)."""
    code, out, err = run(["stream", "--iterations", "1", "--tokens-per-iter", "16", "--sweeps",
                          "--sweep-iterations", "1", "--strategy", "ep,fsedp", "--json"])
    assert code == 0, err[-2000:]
    d = json.loads(out, parse_constant=_no_constants)
    assert set(d["sweeps"]) == {"buffer_x_ddr", "ddr_x_d2d", "microslice_x_buffer", "scaling"}
    assert "null" in out                # the infeasible points, NaN before


# ---- kind 10: one line, and every check before any work --------------------------------------

def test_library_warnings_are_held_back_on_a_refusal():
    import warnings

    from sempar import cli
    from sempar.errors import InputError

    @app.command("zz-test-warnings")
    def _cmd(fail: bool = typer.Option(False, "--fail")) -> None:
        warnings.warn("The given NumPy array is not writable", UserWarning)
        if fail:
            raise InputError("--fail: refused")

    cli._command.cache_clear()
    try:
        refused(["zz-test-warnings", "--fail"], "--fail: refused")
        code, _, err = run(["zz-test-warnings"])
        assert code == 0 and err.strip() == "note: UserWarning: The given NumPy array is not writable"
    finally:
        app.registered_commands.pop()
        cli._command.cache_clear()


CHECKED_FIRST = [
    # would load a model, run a simulation or a benchmark before refusing when broken
    ("record --model tiny-moe64 --text {text} --out {tmp}/a_file/x.parquet", "--out"),
    ("cost-route sweep --text {text} --plot {tmp}/a_file", "--plot"),
    ("serve-sim --trace {trace} --systems sglang --plot {tmp}/a_file", "--plot"),
    ("stream --plot {tmp}/a_file", "--plot"),
    ("plan --trace {trace} --methods vanilla,magic", "--methods"),
]


@pytest.mark.slow
@pytest.mark.parametrize("template,option", CHECKED_FIRST, ids=[t.split()[0] for t, _ in CHECKED_FIRST])
def test_paths_are_checked_before_any_work(template, option, tmp_path):
    (tmp_path / "a_file").write_text("")
    (tmp_path / "t.txt").write_text("a few words of text for the model\n")
    run_in = tmp_path / "run"
    run_in.mkdir()
    args = template.format(text=tmp_path / "t.txt", tmp=tmp_path, trace=TRACE).split()
    r = subprocess.run([sys.executable, "-m", "sempar.cli", *args], capture_output=True,
                       text=True, cwd=run_in, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"error: {option}"), lines[0]
    assert list(run_in.iterdir()) == []


@pytest.mark.slow
def test_bench_result_path_is_checked_first_and_named(tmp_path):
    (tmp_path / "a_file").write_text("")
    env = {**os.environ, "SEMPAR_BENCH_RESULT": str(tmp_path / "a_file" / "r.json")}
    r = subprocess.run([sys.executable, "-m", "sempar.cli", "bench", "--preset", "none"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: $SEMPAR_BENCH_RESULT:"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
